"""``mm-embeddings-cache-producer`` (llm-d-router v0.10): which endpoints recently encoded the media.

A vision model server caches the encoder output of the images (videos, audio) it has processed;
a request repeating an image is cheaper where that image was encoded.  This producer remembers,
per endpoint, the content hashes of the media items it was sent (an LRU of
``cacheSizeInMBPerServer / 2`` entries: upstream's fixed 2 MiB per item), and before scheduling
publishes ``ENCODER_CACHE_MATCH`` per endpoint: the request's unique items and those the endpoint
holds.  ``mm-embeddings-cache-scorer`` turns that into a score.  After scheduling (PreRequest) the
items are added to every target endpoint of the primary profile.  An endpoint's LRU is dropped
when it leaves the datastore (observer) or an ``endpoint-notification-source`` reports it
deleted (extractor; upstream's periodic sweep is not needed: the datastore tells every leave).

The items.  Upstream reads them from the token producer's ``MultiModalFeatures``; this EPP's
token producer carries none, so they are read from the request as upstream's ``estimate``
backend derives them, with its hashes (``hex(xxh64(content))``): in chat completions, each
content part ``image_url`` (its ``url``), ``video_url`` (``url``), ``input_audio`` (``data`` +
``format``) and ``audio_url`` (``url``; upstream hashes the empty ``input_audio`` there, so every
``audio_url`` shares one hash); in Anthropic messages, each ``image`` block (``source.url``, else
``source.data``).  Not read: images inside Anthropic ``tool_result`` blocks, and vLLM's own
multimodal hashes from its render API (upstream's ``vllm`` backend), which name the same
content differently but consistently, so affinity is the same.  A request repeating an item
counts it once; a request without media gets no attribute (the scorer gives 0).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Final

import structlog
from pydantic import Field, model_validator
from xxhash import xxh64_intdigest

from epp.datalayer.api import Endpoint, EndpointEvent
from epp.datalayer.multimodal import ENCODER_CACHE_MATCH, EncoderCacheMatchInfo, MatchItem
from epp.metrics.encoder_cache import ENCODER_CACHE_HIT_RATIO, ENCODER_CACHE_HITS, ENCODER_CACHE_QUERIES
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest
from epp.scheduling.api import SchedulingResult

log = structlog.get_logger(__name__)

DEFAULT_CACHE_SIZE_MB: Final = 4096
BYTES_PER_ITEM: Final = 2 * 1024 * 1024  # upstream's assumed encoder-cache size of one item
MAX_DUMP_PODS: Final = 100


def capacity_from_mb(mb: int) -> int:
    """LRU entries per endpoint for a MiB budget (<= 0: the 4096 MiB default); at least 1."""
    if mb <= 0:
        mb = DEFAULT_CACHE_SIZE_MB
    return max(mb * 1024 * 1024 // BYTES_PER_ITEM, 1)


class MmEmbeddingsParams(PluginParams):
    """``cacheSizeInMBPerServer``; ``cacheSizeInMB`` is what llm-d-router's own sample config
    sets (the name the parameter had before its release): taken, with a warning naming the real one."""

    cache_size_in_mb_per_server: int = Field(default=0, alias="cacheSizeInMBPerServer")
    cache_size_in_mb: int | None = Field(default=None, alias="cacheSizeInMB")

    @model_validator(mode="after")
    def _one_size(self) -> MmEmbeddingsParams:
        if self.cache_size_in_mb is not None and "cache_size_in_mb_per_server" in self.model_fields_set:
            raise ValueError(
                "cacheSizeInMB: set only cacheSizeInMBPerServer (cacheSizeInMB is its unreleased name)"
            )
        return self


def _hash(content: str) -> str:
    return format(xxh64_intdigest(content.encode()), "x")


def _url(part: dict[str, Any], key: str) -> str:
    value = part.get(key)
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else ""


def _content_parts(messages: Any) -> Iterator[dict[str, Any]]:
    """Every object part of the messages' list contents, in order: chat completions and Anthropic
    messages share that shape (a string content has no media)."""
    if not isinstance(messages, list):
        return
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            yield from (part for part in content if isinstance(part, dict))


def _chat_media(messages: Any) -> Iterator[tuple[str, str]]:
    """(content, modality) of every media part of chat messages, in order."""
    for part in _content_parts(messages):
        kind = part.get("type")
        if kind == "image_url":
            yield _url(part, "image_url"), "image"
        elif kind == "video_url":
            yield _url(part, "video_url"), "video"
        elif kind == "audio_url":
            yield _url(part, "audio_url"), "audio"
        elif kind == "input_audio":
            audio = part.get("input_audio")
            if isinstance(audio, dict):
                yield f"{audio.get('data') or ''}{audio.get('format') or ''}", "audio"


def _anthropic_media(messages: Any) -> Iterator[tuple[str, str]]:
    """(content, "image") of every image block of Anthropic messages, in order."""
    for block in _content_parts(messages):
        if block.get("type") == "image":
            src = block.get("source")
            if isinstance(src, dict):
                value = src.get("url") or src.get("data")
                if isinstance(value, str):
                    yield value, "image"


def media_items(request: InferenceRequest) -> tuple[MatchItem, ...]:
    """The request's unique media items (module docstring), in order of first appearance."""
    body = request.body
    if body is None or body.json is None:
        return ()
    if body.api is ApiKind.CHAT_COMPLETIONS:
        found = _chat_media(body.json.get("messages"))
    elif body.api is ApiKind.MESSAGES:
        found = _anthropic_media(body.json.get("messages"))
    else:
        return ()
    items: dict[str, MatchItem] = {}
    for content, modality in found:
        if content:
            h = _hash(content)
            items[h] = MatchItem(h, 1, modality)
    return tuple(items.values())


class MmEmbeddingsCacheProducer(PluginBase):
    """Type ``mm-embeddings-cache-producer``.  Produces ``ENCODER_CACHE_MATCH``.

    DataProducer, PreRequest, EndpointObserver and an extractor of ``endpoint-notification-source``
    (module docstring).  Parameters: ``cacheSizeInMBPerServer`` (4096; <= 0 is the default).
    """

    TYPE: ClassVar[str] = "mm-embeddings-cache-producer"
    PARAMS: ClassVar[type[PluginParams]] = MmEmbeddingsParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({ENCODER_CACHE_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    INPUT: ClassVar[type[EndpointEvent]] = EndpointEvent

    def __init__(self, name: str, params: MmEmbeddingsParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        mb = params.cache_size_in_mb_per_server
        if params.cache_size_in_mb is not None:
            log.warning(
                "deprecated_parameter",
                plugin=str(self.typed_name),
                parameter="cacheSizeInMB",
                replacement="cacheSizeInMBPerServer",
            )
            mb = params.cache_size_in_mb
        self.capacity = capacity_from_mb(mb)
        self.caches: dict[str, OrderedDict[str, None]] = {}  # endpoint name -> LRU of item hashes
        self._live: set[str] = set()
        self._state_key: StateKey[tuple[MatchItem, ...]] = StateKey(f"{name}/{self.TYPE}")
        self._hit_ratio = ENCODER_CACHE_HIT_RATIO.labels(self.TYPE, name)

    # DataProducer -----------------------------------------------------------------------
    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        items = media_items(request)
        if items:
            self.match(state, items, endpoints)

    def match(self, state: CycleState, items: tuple[MatchItem, ...], endpoints: Sequence[Endpoint]) -> None:
        """Publish each endpoint's match of ``items``; remember them for PreRequest."""
        self.record_lookups(items)
        nothing = EncoderCacheMatchInfo((), items)  # shared by every endpoint holding none
        values: dict[Any, EncoderCacheMatchInfo] = {}
        caches = self.caches
        observe = self._hit_ratio.observe
        total = len(items)
        for ep in endpoints:
            cache = caches.get(ep.metadata.name)
            matched = tuple(i for i in items if i.hash in cache) if cache else ()
            values[ep] = EncoderCacheMatchInfo(matched, items) if matched else nothing
            observe(len(matched) / total)
        state.set_attributes(ENCODER_CACHE_MATCH, values)
        state.put(self._state_key, items)

    def record_lookups(self, items: Sequence[MatchItem]) -> None:
        """Upstream's counters: a query per item, a hit per endpoint whose LRU holds it."""
        name = self.typed_name.name
        for item in items:
            ENCODER_CACHE_QUERIES.labels(self.TYPE, name, item.modality).inc()
            for pod, cache in self.caches.items():
                if item.hash in cache:
                    ENCODER_CACHE_HITS.labels(self.TYPE, name, pod, item.modality).inc()

    # PreRequest -------------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        items = state.get(self._state_key)
        primary = result.profile_results.get(result.primary_profile_name)
        if not items or primary is None:
            return
        for ep in primary.target_endpoints:
            self.record(ep.metadata.name, items)

    def record(self, name: str, items: Sequence[MatchItem]) -> None:
        """``items`` were sent to endpoint ``name``: most recent in its LRU, the oldest evicted."""
        cache = self.caches.get(name)
        if cache is None:
            cache = self.caches[name] = OrderedDict()
        for item in items:
            cache[item.hash] = None
            cache.move_to_end(item.hash)
            if len(cache) > self.capacity:
                cache.popitem(last=False)

    # endpoint lifecycle -----------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        self._live.add(endpoint.metadata.name)

    def endpoint_removed(self, endpoint: Endpoint) -> None:  # its hit series stay, as upstream's
        self._live.discard(endpoint.metadata.name)
        self.caches.pop(endpoint.metadata.name, None)

    def extract(self, data: Any, endpoint: Endpoint) -> None:
        """endpoint-notification-source's events: a deleted endpoint's LRU goes (as upstream's Extract)."""
        if isinstance(data, EndpointEvent) and data.type == "Delete":
            self.caches.pop(endpoint.metadata.name, None)

    def debug_state(self) -> dict[str, Any]:
        """Upstream's DumpState: known pods and items per pod (most first), each list capped at 100;
        the hashes themselves are not shown."""
        pods = sorted(((len(c), name) for name, c in self.caches.items()), key=lambda t: (-t[0], t[1]))
        return {
            "podList": sorted(self._live)[:MAX_DUMP_PODS],
            "totalKnownPods": len(self._live),
            "pods": [{"pod": name, "items": n} for n, name in pods[:MAX_DUMP_PODS]],
            "totalPods": len(self.caches),
            "maxPods": MAX_DUMP_PODS,
        }
