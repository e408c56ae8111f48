"""``precise-prefix-cache-scorer``: prefer endpoints whose engines report holding the prompt's prefix.

llm-d's plugin of the same name, on the engines' own KV-cache events instead of a guess: the
request is tokenised as the engine will (``tokenizerConfig``), its blocks hashed as the engine
hashes them (``tokenProcessorConfig``), and each candidate scored by the longest run of those
blocks, from the first, that its engine has reported storing and not evicting (the
``kvEventsConfig`` subscriber feeds the index).  While an endpoint's event stream is not trusted
(a gap, a restart mid-stream, a silent publisher, a configuration mismatch) its run is taken
from the approximate index (``approx-prefix-cache-producer``, auto-created) instead.

Score, as llm-d: blocks matched, min-max normalised over the candidates with a match (all equal:
1.0; no match: 0.0).  ``scoreNormalization: fraction`` gives matched/total instead, as the
approximate ``prefix-cache-scorer`` does.  docs/precise-prefix.md has the parameters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import structlog
from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.datalayer.kvevents import metrics as m
from epp.datalayer.kvevents.hashing import HASH_ALGOS, BlockHasher
from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.datalayer.kvevents.tokens import LocalTokenizer, ServerTokenizer, TokenSource
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult, ScorerCategory

log = structlog.get_logger(__name__)

PRECISE_PREFIX_MATCH: AttributeKey[PrefixMatchInfo] = AttributeKey(
    "PrecisePrefixCacheMatchInfoKey", PrefixMatchInfo
)


class TokenProcessorConfig(PluginParams):
    """llm-d's ``tokenProcessorConfig``; ``hashAlgo`` is ours (llm-d assumes sha256_cbor)."""

    block_size: int = 16
    hash_seed: str = ""  # the engines' PYTHONHASHSEED, verbatim
    hash_algo: str = "sha256_cbor"  # the engines' --prefix-caching-hash-algo


class PodDiscoveryConfig(PluginParams):
    socket_port: int = 5557


class KVEventsConfig(PluginParams):
    """llm-d's ``kvEventsConfig`` (pod discovery mode) plus our replay and silence settings."""

    topic_filter: str = "kv@"
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryConfig = Field(default_factory=PodDiscoveryConfig)
    replay_port: int = 0  # the engines' replay_endpoint port; 0: no replay
    endpoints: dict[str, str] = Field(default_factory=dict)  # endpoint name or host:port → tcp://…
    replay_endpoints: dict[str, str] = Field(default_factory=dict)
    silence_timeout_seconds: float = 10.0
    replay_timeout_seconds: float = 2.0
    verify_hashes: bool = True  # recompute sampled first blocks to catch an algorithm/seed mismatch


class IndexerConfig(PluginParams):
    lru_capacity_per_server: int = 31250  # blocks kept per endpoint (GIE's approximate default)
    max_prefix_blocks_to_match: int = 256


class TokenizerConfig(PluginParams):
    """``server``: the engine's POST /tokenize; ``local``: ``tokenizerPath`` (a tokenizer.json)."""

    mode: Literal["server", "local"] = "server"
    tokenizer_path: str = ""
    timeout_seconds: float = 1.0
    scheme: Literal["http", "https"] = "http"


class PrecisePrefixParams(PluginParams):
    token_processor_config: TokenProcessorConfig = Field(default_factory=TokenProcessorConfig)
    kv_events_config: KVEventsConfig = Field(default_factory=KVEventsConfig)
    indexer_config: IndexerConfig = Field(default_factory=IndexerConfig)
    tokenizer_config: TokenizerConfig = Field(default_factory=TokenizerConfig)
    score_normalization: Literal["minMax", "fraction"] = "minMax"


@dataclass(slots=True)
class _Prediction:
    """What PreRequest and ResponseComplete need: the predicted cached tokens per endpoint name."""

    prompt_tokens: int
    tokens_by_name: dict[str, int]
    fallback: frozenset[str]
    predicted: int = -1  # for the picked endpoint, set in PreRequest


class _Correlation:
    """Running Pearson correlation and mean absolute error of (predicted, observed)."""

    __slots__ = ("abs_err", "n", "sx", "sxx", "sxy", "sy", "syy")

    def __init__(self) -> None:
        self.n = 0
        self.sx = self.sy = self.sxx = self.syy = self.sxy = self.abs_err = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.syy += y * y
        self.sxy += x * y
        self.abs_err += abs(x - y)

    def state(self) -> dict[str, Any]:
        n = self.n
        r: float | None = None
        if n > 1:
            vx = n * self.sxx - self.sx * self.sx
            vy = n * self.syy - self.sy * self.sy
            if vx > 0 and vy > 0:
                r = (n * self.sxy - self.sx * self.sy) / math.sqrt(vx * vy)
        return {
            "samples": n,
            "pearson": r,
            "meanPredictedTokens": self.sx / n if n else None,
            "meanObservedTokens": self.sy / n if n else None,
            "meanAbsErrorTokens": self.abs_err / n if n else None,
        }


class PrecisePrefixCacheScorer(PluginBase):
    """Score by the engines' reported KV blocks.  Type ``precise-prefix-cache-scorer``, category Affinity.

    Also a data producer (tokenise, hash and match before scheduling; produces
    ``PrecisePrefixCacheMatchInfoKey``; consumes ``PREFIX_MATCH`` for the fallback), PreRequest
    (records the prediction for the picked endpoint and tells the silence watchdog events are
    due), ResponseComplete (compares with the engine's ``cached_tokens``), an endpoint observer
    (one subscriber per endpoint) and Lifecycle (the subscriber's sockets and tasks).
    """

    TYPE: ClassVar[str] = "precise-prefix-cache-scorer"
    PARAMS: ClassVar[type[PluginParams]] = PrecisePrefixParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})

    def __init__(self, name: str, params: PrecisePrefixParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        tp = params.token_processor_config
        if tp.block_size <= 0:
            raise ConfigError(f"{self.TYPE}: tokenProcessorConfig.blockSize must be > 0, got {tp.block_size}")
        if tp.hash_algo not in HASH_ALGOS:
            raise ConfigError(
                f"{self.TYPE}: tokenProcessorConfig.hashAlgo must be one of {', '.join(HASH_ALGOS)}, "
                f"got {tp.hash_algo!r}"
            )
        ic = params.indexer_config
        if ic.lru_capacity_per_server <= 0 or ic.max_prefix_blocks_to_match < 0:
            raise ConfigError(
                f"{self.TYPE}: indexerConfig needs lruCapacityPerServer > 0, maxPrefixBlocksToMatch >= 0"
            )
        ke = params.kv_events_config
        if not ke.discover_pods and not ke.endpoints:
            raise ConfigError(
                f"{self.TYPE}: kvEventsConfig: only per-endpoint subscription is supported: set discoverPods "
                "(podDiscoveryConfig.socketPort) or endpoints"
            )
        self.hasher = BlockHasher(tp.hash_algo, tp.block_size, tp.hash_seed)
        self.block_size = tp.block_size
        self.max_blocks = ic.max_prefix_blocks_to_match
        self.normalization = params.score_normalization
        self.index = BlockIndex(ic.lru_capacity_per_server)
        self.subscriber = KVEventSubscriber(
            SubscriberSettings(
                topic_filter=ke.topic_filter,
                socket_port=ke.pod_discovery_config.socket_port,
                replay_port=ke.replay_port,
                endpoints=dict(ke.endpoints),
                replay_endpoints=dict(ke.replay_endpoints),
                block_size=tp.block_size,
                hasher=self.hasher if ke.verify_hashes else None,
                silence_timeout=ke.silence_timeout_seconds,
                replay_timeout=ke.replay_timeout_seconds,
            ),
            self.index,
        )
        tc = params.tokenizer_config
        self.tokens: TokenSource
        if tc.mode == "local":
            if not tc.tokenizer_path:
                raise ConfigError(f"{self.TYPE}: tokenizerConfig.mode local needs tokenizerPath")
            try:
                self.tokens = LocalTokenizer(tc.tokenizer_path)
            except Exception as e:
                raise ConfigError(f"{self.TYPE}: cannot load tokenizer {tc.tokenizer_path!r}: {e}") from e
        else:
            self.tokens = ServerTokenizer(timeout=tc.timeout_seconds, scheme=tc.scheme)
        self._key: StateKey[_Prediction] = StateKey(f"{name}/{self.TYPE}")
        self.correlation = _Correlation()
        self.unreported = 0  # responses without cached_tokens
        self.tokenize_failures = 0

    # Lifecycle and endpoints ------------------------------------------------------------------
    async def start(self) -> None:
        await self.subscriber.start()

    async def stop(self) -> None:
        await self.subscriber.stop()
        if isinstance(self.tokens, ServerTokenizer):
            await self.tokens.close()

    def endpoint_added(self, endpoint: Endpoint) -> None:
        self.subscriber.add(endpoint)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.subscriber.remove(endpoint)

    # DataProducer -----------------------------------------------------------------------------
    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        try:
            ids = await self.tokens.token_ids(request, endpoints)
        except Exception as e:
            self.tokenize_failures += 1
            log.debug("precise_prefix_tokenize_failed", error=str(e))
            ids = None
        self.prepare(state, request, endpoints, ids)

    def lora_name(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        """The adapter the engine will hash into every block: the target model when a candidate
        reports it as a running or waiting adapter."""
        model = request.target_model
        if not model:
            return None
        for ep in endpoints:
            mt = ep.metrics
            if model in mt.active_models or model in mt.waiting_models:
                return model
        return None

    def prepare(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        ids: Sequence[int] | None,
    ) -> None:
        """The synchronous part: hash, match, fall back per inconsistent endpoint (every endpoint
        when the token ids could not be had: ``ids`` None)."""
        bs = self.block_size
        trusted = ids is not None
        ids = ids or ()
        salt = request.body.cache_salt if request.body is not None else ""
        hashes = self.hasher.hashes(ids, self.max_blocks, self.lora_name(request, endpoints), salt or None)
        total = len(hashes)
        # vLLM recomputes at least the last prompt token: a full hit is one block short
        cap = min(total, (len(ids) - 1) // bs) if ids else 0
        index = self.index
        states = index.states
        mask = 0
        slots: list[int | None] = []
        for ep in endpoints:
            st = states.get(ep.metadata.name)
            if trusted and st is not None and st.consistent:
                slots.append(st.slot)
                mask |= 1 << st.slot
            else:
                slots.append(None)
        counts = index.match(hashes, mask) if mask and hashes else {}
        approx = state.attributes(PREFIX_MATCH) if len(slots) != mask.bit_count() else {}
        zero = PrefixMatchInfo(0, total, bs)
        values: dict[Hashable, PrefixMatchInfo] = {}
        by_name: dict[str, int] = {}
        fallback: list[str] = []
        for ep, slot in zip(endpoints, slots, strict=True):
            if slot is not None:
                n = counts.get(slot, 0)
            else:
                name = ep.metadata.name
                fallback.append(name)
                m.PRECISE_FALLBACKS.labels(name).inc()
                info = approx.get(ep)
                if info is not None and info.match_blocks:
                    # the approximate index's blocks, in engine blocks; its total when ours is unknown
                    approx_total = (info.total_blocks * info.block_size_tokens) // bs
                    n = min(
                        (info.match_blocks * info.block_size_tokens) // bs, total if trusted else approx_total
                    )
                    if n:
                        values[ep] = PrefixMatchInfo(n, total if trusted else approx_total, bs)
                        by_name[name] = min(n, cap if trusted else approx_total) * bs
                        continue
                values[ep] = zero
                continue
            if n:
                values[ep] = PrefixMatchInfo(n, total, bs)
                by_name[ep.metadata.name] = min(n, cap) * bs
            else:
                values[ep] = zero
        state.set_attributes(PRECISE_PREFIX_MATCH, values)
        state.put(self._key, _Prediction(len(ids), by_name, frozenset(fallback)))

    # Scorer -----------------------------------------------------------------------------------
    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(PRECISE_PREFIX_MATCH)
        if not infos:
            return [0.0] * len(endpoints)
        blocks = [info.match_blocks if info is not None else 0 for info in map(infos.get, endpoints)]
        if self.normalization == "fraction":
            return [
                b / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0
                for b, info in zip(blocks, map(infos.get, endpoints), strict=True)
            ]
        hits = [b for b in blocks if b > 0]
        if not hits:
            return [0.0] * len(endpoints)
        lo, hi = min(hits), max(hits)
        if lo == hi:
            return [1.0 if b > 0 else 0.0 for b in blocks]
        span = hi - lo
        return [(b - lo) / span if b > 0 else 0.0 for b in blocks]

    # PreRequest / ResponseComplete ------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        primary = result.profile_results.get(result.primary_profile_name)
        prediction = state.get(self._key)
        if primary is None or not primary.target_endpoints or prediction is None:
            return
        name = primary.target_endpoints[0].metadata.name
        prediction.predicted = prediction.tokens_by_name.get(name, 0)
        m.PRECISE_PREDICTED_TOKENS.observe(prediction.predicted)
        if prediction.prompt_tokens >= self.block_size:
            self.subscriber.note_routed(name, time.monotonic())

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        prediction = state.get(self._key)
        if prediction is None or prediction.predicted < 0 or not response.end_of_stream:
            return
        usage = response.usage
        if usage is None or usage.cached_tokens is None:
            self.unreported += 1
            return
        observed = usage.cached_tokens
        m.PRECISE_OBSERVED_TOKENS.observe(observed)
        m.PRECISE_PREDICTION_ERROR_TOKENS.observe(abs(prediction.predicted - observed))
        self.correlation.add(prediction.predicted, observed)

    # DebugState -------------------------------------------------------------------------------
    def debug_state(self) -> dict[str, Any]:
        return {
            "hashAlgo": self.hasher.algo,
            "blockSize": self.block_size,
            "tokenizer": type(self.tokens).__name__,
            "tokenizeFailures": self.tokenize_failures,
            "predictedVsObserved": {
                **self.correlation.state(),
                "responsesWithoutCachedTokens": self.unreported,
            },
            **self.subscriber.debug_state(),
        }
