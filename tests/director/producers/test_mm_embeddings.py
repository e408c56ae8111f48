"""mm-embeddings-cache-producer: llm-d-router v0.10's producer_test.go vectors, the media items
read from chat and Anthropic requests, and repeated images routed back through the director."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import xxhash
from pydantic import ValidationError

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointEvent
from epp.datalayer.multimodal import ENCODER_CACHE_MATCH, EncoderCacheMatchInfo, MatchItem
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.director.producers.mm_embeddings import MmEmbeddingsCacheProducer, capacity_from_mb, media_items
from epp.metrics.series import REGISTRY
from epp.plugin.state import CycleState
from epp.request import ApiKind, RequestBody
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.builders import chat_body, completions_body, make_endpoint
from epp.testing.plugins import build
from tests.scheduling.builders import request


def producer(**params: Any) -> MmEmbeddingsCacheProducer:
    p: MmEmbeddingsCacheProducer = build(MmEmbeddingsCacheProducer, **params)
    return p


def image(h: str) -> MatchItem:
    return MatchItem(h, 1, "image")


def scheduled(*targets: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileRunResult(tuple(targets))}, "default")


def cached(p: MmEmbeddingsCacheProducer) -> dict[str, set[str]]:
    """hash -> endpoint names holding it (upstream's cacheSnapshot)."""
    out: dict[str, set[str]] = {}
    for name, cache in p.caches.items():
        for h in cache:
            out.setdefault(h, set()).add(name)
    return out


def test_capacity_from_cache_size() -> None:
    assert (capacity_from_mb(4), capacity_from_mb(2048), capacity_from_mb(0)) == (2, 1024, 2048)
    assert capacity_from_mb(1) == 1
    assert producer(cacheSizeInMBPerServer=4).capacity == 2
    assert producer().capacity == 2048


def test_parameters() -> None:
    with pytest.raises(ValidationError, match="cacheSizeInMBPerServer"):
        producer(cacheSizeInMBPerServer="bad")
    # llm-d-router's sample config says cacheSizeInMB: taken, with a warning naming the real field
    assert producer(cacheSizeInMB=2048).capacity == 1024
    with pytest.raises(ValidationError, match="cacheSizeInMB: set only cacheSizeInMBPerServer"):
        producer(cacheSizeInMB=2048, cacheSizeInMBPerServer=4)


def test_matches_several_pods_and_pre_request_records_the_target() -> None:
    p = producer()
    a, b, c = (make_endpoint(i) for i in range(3))
    p.record(a.metadata.name, [image("hash-a")])
    p.record(b.metadata.name, [image("hash-a")])
    items = (image("hash-a"), image("hash-c"))
    state = CycleState()
    p.match(state, items, [a, b, c])
    infos = state.attributes(ENCODER_CACHE_MATCH)
    assert infos[a] == infos[b] == EncoderCacheMatchInfo((image("hash-a"),), items)
    assert infos[c] == EncoderCacheMatchInfo((), items)

    p.pre_request(state, request(), scheduled(c))
    snap = cached(p)
    assert snap["hash-a"] == {a.metadata.name, b.metadata.name, c.metadata.name}
    assert snap["hash-c"] == {c.metadata.name}


def test_lru_evicts_the_oldest() -> None:
    p = producer(cacheSizeInMBPerServer=4)  # two entries
    ep = make_endpoint(0)
    for h in ("hash-1", "hash-2", "hash-3"):
        state = CycleState()
        p.match(state, (image(h),), [ep])
        p.pre_request(state, request(), scheduled(ep))
    assert set(cached(p)) == {"hash-2", "hash-3"}


def test_recording_again_refreshes_recency() -> None:
    p = producer(cacheSizeInMBPerServer=4)
    name = make_endpoint(0).metadata.name
    p.record(name, [image("old"), image("new")])
    p.record(name, [image("old")])  # used again: now the most recent
    p.record(name, [image("third")])
    assert set(cached(p)) == {"old", "third"}


def test_deleted_endpoint_is_forgotten() -> None:
    p = producer()
    a, b = make_endpoint(0), make_endpoint(1)
    for ep in (a, b):
        p.endpoint_added(ep)
        p.record(ep.metadata.name, [image("hash-a")])
    p.extract(EndpointEvent("Delete", b), b)  # endpoint-notification-source's event
    assert cached(p)["hash-a"] == {a.metadata.name}
    p.extract(EndpointEvent("AddOrUpdate", a), a)
    assert cached(p)["hash-a"] == {a.metadata.name}
    p.endpoint_removed(a)  # the datastore's
    assert cached(p) == {}
    assert p.debug_state()["totalKnownPods"] == 1


def test_debug_state_counts_items_per_pod_without_hashes() -> None:
    p = producer()
    a, b, c = (make_endpoint(i) for i in range(3))
    for ep in (b, a, c):
        p.endpoint_added(ep)
    p.record(a.metadata.name, [image("h1"), image("h2"), image("h3")])
    p.record(b.metadata.name, [image("h1"), image("h2")])
    state = p.debug_state()
    assert "h1" not in orjson.dumps(state).decode()
    assert state == {
        "podList": [a.metadata.name, b.metadata.name, c.metadata.name],
        "totalKnownPods": 3,
        "pods": [{"pod": a.metadata.name, "items": 3}, {"pod": b.metadata.name, "items": 2}],
        "totalPods": 2,
        "maxPods": 100,
    }


def test_debug_state_caps_pods() -> None:
    p = producer()
    for i in range(105):
        p.record(f"default/pod-{i:03d}", [image(f"h-{i}-{j}") for j in range(i + 1)])
    state = p.debug_state()
    assert state["totalPods"] == 105 and len(state["pods"]) == 100
    assert state["pods"][0] == {"pod": "default/pod-104", "items": 105}


def hexhash(content: str) -> str:
    return format(xxhash.xxh64(content.encode()).intdigest(), "x")


def test_media_items_of_a_chat_request() -> None:
    parts = [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}},
        {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": "https://example.com/a.mp3"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},  # counted once
        {"type": "image_url", "image_url": {"url": ""}},  # nothing to hash
    ]
    req = request(body=chat_body([{"role": "user", "content": parts}, {"role": "user", "content": "text"}]))
    assert media_items(req) == (
        MatchItem(hexhash("https://example.com/cat.png"), 1, "image"),  # upstream estimate's hash
        MatchItem(hexhash("https://example.com/clip.mp4"), 1, "video"),
        MatchItem(hexhash("UklGRwav"), 1, "audio"),
        MatchItem(hexhash("https://example.com/a.mp3"), 1, "audio"),
    )


def test_media_items_of_other_requests() -> None:
    doc = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/dog.jpg"}},
                {"type": "text", "text": "what differs?"},
            ]},
        ],
    }  # fmt: skip
    anthropic = request(body=RequestBody(api=ApiKind.MESSAGES, raw=b"", json=doc))
    assert [i.hash for i in media_items(anthropic)] == [
        hexhash("iVBOR"),
        hexhash("https://example.com/dog.jpg"),
    ]
    assert media_items(request(body=completions_body("an image_url in text"))) == ()
    assert media_items(request()) == ()


async def test_a_request_without_media_writes_nothing() -> None:
    p = producer()
    state = CycleState()
    await p.prepare_request_data(
        state, request(body=chat_body([{"role": "user", "content": "hi"}])), [make_endpoint(0)]
    )
    assert not state.attributes(ENCODER_CACHE_MATCH)
    p.pre_request(state, request(), scheduled(make_endpoint(0)))
    assert p.caches == {}


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: mm-embeddings-cache-producer
  - type: mm-embeddings-cache-scorer
  - type: max-score-picker
  - type: single-profile-handler
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: mm-embeddings-cache-scorer
      - pluginRef: max-score-picker
"""


async def test_repeated_images_return_to_the_endpoint_that_encoded_them() -> None:
    components = build_components(load_config(CONFIG), default_registry())
    ds = Datastore()
    for i in range(4):
        ds.upsert(make_endpoint(i).metadata)
    director = Director(
        ds, components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    )

    async def route(url: str, text: str) -> str:
        parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]})
        decision = await director.start({":path": "/v1/chat/completions"}, {}).route(body)
        return decision.destination

    homes = {url: await route(url, "first look") for url in ("https://x/1.png", "https://x/2.png")}
    for n in range(5):  # ties among 4 endpoints are broken at random: 5 hits by chance are 1 in 1024
        for url, home in homes.items():
            assert await route(url, f"question {n}") == home


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_lookups_count_queries_and_hits_per_pod() -> None:
    """metrics_test.go's TestRecordItemLookupsMetrics and TestRecordHitRatioMetrics."""
    p = producer()
    pod = make_endpoint(0)
    labels = {"plugin_type": p.TYPE, "plugin_name": p.typed_name.name}
    queries = {**labels, "modality": "image"}
    hits = {**queries, "pod": pod.metadata.name}
    q0, h0 = (
        sample("llm_d_epp_encoder_cache_queries_total", queries),
        sample("llm_d_epp_encoder_cache_hits_total", hits),
    )
    n0 = sample("llm_d_epp_encoder_cache_hit_ratio_count", labels)
    s0 = sample("llm_d_epp_encoder_cache_hit_ratio_sum", labels)

    p.match(CycleState(), (image("hash-1"), image("hash-2")), [pod])  # two misses
    assert sample("llm_d_epp_encoder_cache_queries_total", queries) == q0 + 2
    assert sample("llm_d_epp_encoder_cache_hits_total", hits) == h0

    p.record(pod.metadata.name, [image("hash-1")])
    p.match(CycleState(), (image("hash-1"), image("hash-3")), [pod])  # a hit and a miss
    assert sample("llm_d_epp_encoder_cache_queries_total", queries) == q0 + 4
    assert sample("llm_d_epp_encoder_cache_hits_total", hits) == h0 + 1
    assert sample("llm_d_epp_encoder_cache_hit_ratio_count", labels) == n0 + 2  # one per endpoint and request
    assert sample("llm_d_epp_encoder_cache_hit_ratio_sum", labels) == pytest.approx(s0 + 0.5)
