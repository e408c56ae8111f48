"""``precise-prefix-cache-scorer``: prefer endpoints whose engines report holding the prompt's prefix.

llm-d's plugin of the same name.  Where ``prefix-cache-scorer`` guesses what each engine holds
from where earlier prompts were routed, this scorer reads what the engines say in their KV-cache
events: the request is tokenised as the engine will (``tokenizerConfig``), its full blocks hashed
as the engine hashes them (``tokenProcessorConfig``), and each candidate scored by the longest run
of those blocks, from the first, that its engine has reported storing and not since evicting
(the index is fed by this plugin's ``kvEventsConfig`` subscriber, or by a ``kvEventsSource``).

Fallback: while an endpoint's event stream is not trusted (a sequence gap, a restart mid-stream,
a silent publisher, a configuration mismatch), its run is the larger of what its events still say
and the approximate index's run (``approx-prefix-cache-producer``, auto-created).  A request that
cannot be tokenised is scored from the approximate index for every candidate.

Speculative entries (``speculativeIndexing``, on by default): events arrive only after the engine
has prefilled a request, so at routing time the request's blocks are recorded as pending on the
picked endpoint (``kvevents.pending``) and count as held, weighted by ``speculativeWeight``, while
the request is in flight (a block the engine has reported counts once; an eviction while the
request still waits there does not take it away, since the request will store it again), ending
``speculativeGraceSeconds`` after the request or ``speculativeTtlSeconds`` after routing.  Without
them, a burst of one prefix spreads over the fleet while its first request is still queued.

Nobody holds it (``approximateWhenUnheld``, on by default): when no candidate's engine holds even
the request's first block, reported or pending, every candidate is scored from the approximate
index instead, i.e. the prefix goes back to the endpoint it was last routed to, as
``prefix-cache-scorer`` would send it.  Under overload engines evict a group's prefix between its
requests; placing the group by load alone then scatters it over the fleet (each replica keeps more
groups than fit, and evicts more), where returning it to its last endpoint keeps the groups
partitioned.

Prediction (``predictedVsObserved``, a measurement: it does not change the score): what the picked
endpoint will still hold when the request runs, not only what it holds now. A block some in-flight
request there holds or computes counts; a block only the events report is in the engine's free
queue, and survives if fewer new blocks are queued ahead of the request there (the EPP's own count,
released at the first response byte) than there are free or older blocks to evict before it
(``BlockIndex.older``, counted up to the free queue's cached blocks from the scraped KV use; the
scorer touches a request's blocks tail first when it ends, as the engine frees them).
``scheduling/reuse_sampler.py`` compares it with the engine's reported ``cached_tokens``.

Score, as llm-d: blocks matched, min-max normalised over the candidates with a match (all equal:
1.0; no match: 0.0).  ``scoreNormalization: fraction`` gives matched/total instead, as the
approximate ``prefix-cache-scorer`` does.  docs/precise-prefix.md has the parameters.

Active-active replicas (``epp.plugin.replicated.Replicated``): every replica subscribes to every
engine's events, so only the pending entries are shared.  ``drain`` returns ``[endpoint name,
hashes]`` for each request routed here since the last drain (kept once a hub has drained, at most
``MAX_UNDRAINED`` between two drains); ``apply`` adds them as pending on this replica under the
peer's identity, where they last the speculative TTL (this replica never sees those requests end);
``forget`` drops the peer's.  ``snapshot`` is the pending records of requests still in flight,
``restore`` adds them under a placeholder origin (they expire by TTL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import structlog
from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, PrefixMatchInfo
from epp.datalayer.kvevents import metrics as m
from epp.datalayer.kvevents.config import (
    KVBlockIndexConfig,
    KVCacheBackendConfig,
    KVEventsConfig,
    TokenizersPoolConfig,
    TokenProcessorConfig,
    build_subscriber,
    default_backends,
)
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.pending import PendingRecord
from epp.datalayer.kvevents.subscriber import KVEventSubscriber
from epp.datalayer.kvevents.tokenizers import UdsTokenizer, parse_duration, pool_tokenizer
from epp.datalayer.kvevents.tokens import TOKENIZED_PROMPT, LocalTokenizer, ServerTokenizer, TokenSource
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.counts import subtract
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.origin_shares import SNAPSHOT_ORIGIN  # restore(): the records a snapshot carried
from epp.plugin.replicated import parse_routed, unsynced
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult, ScorerCategory
from epp.scheduling.reuse_sampler import ReuseSampler

log = structlog.get_logger(__name__)

MAX_UNDRAINED: Final = 65536  # routed requests kept for the sync hub between two drains


class IndexerConfig(PluginParams):
    """Ours (``lruCapacityPerServer``, ``maxPrefixBlocksToMatch``) and llm-d-kv-cache's indexer
    configuration (``kvBlockIndexConfig``, ``kvCacheBackendConfigs``, ``tokenizersPoolConfig``, and
    the older nesting of ``tokenProcessorConfig`` here); docs/precise-prefix.md maps each field."""

    lru_capacity_per_server: int = 31250  # blocks kept per endpoint (GIE's approximate default)
    max_prefix_blocks_to_match: int | None = None  # default 256, or kvBlockIndexConfig's older field
    kv_block_index_config: KVBlockIndexConfig = Field(default_factory=KVBlockIndexConfig)
    kv_cache_backend_configs: list[KVCacheBackendConfig] = Field(default_factory=default_backends)
    tokenizers_pool_config: TokenizersPoolConfig | None = None
    token_processor_config: TokenProcessorConfig | None = None  # llm-d-kv-cache before 0.3


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
    kv_events_source: str = ""  # a kv-events-source plugin to read instead of subscribing itself
    speculative_indexing: bool = True  # count routed, not yet reported blocks (kvevents.pending)
    speculative_weight: float = Field(default=1.0, ge=0.0, le=1.0)  # a pending block vs a reported one
    speculative_ttl_seconds: float = Field(default=30.0, gt=0.0)  # the longest a pending entry lives
    # llm-d's name, a Go duration; overrides speculativeTtlSeconds when set
    speculative_ttl: str = Field(default="", alias="speculativeTTL")
    speculative_grace_seconds: float = Field(default=2.0, ge=0.0)  # after its request ends
    approximate_when_unheld: bool = (
        True  # no candidate holds the first block: score from the approximate index
    )


@dataclass(slots=True)
class _Prediction:
    """What PreRequest and ResponseComplete need: the predicted cached tokens per endpoint name."""

    prompt_tokens: int
    blocks_by_name: dict[str, int]  # matched blocks per endpoint with a match, pending included
    confirmed_by_name: dict[str, int]  # the same from reported blocks only (and the fallback)
    fallback: frozenset[str]
    total_blocks: int  # the request's hashed full blocks (the approximate index's, untokenised)
    cap: int  # most blocks the engine can reuse: it recomputes at least the last prompt token
    hashes: list[int]  # the request's block hashes (empty when untokenised)
    predicted: int = -1  # cached tokens the pick will still hold when the request runs (PreRequest)
    predicted_routed: int = -1  # what the pick held at routing, pending included (what was scored)
    predicted_confirmed: int = -1  # the same from reported blocks only
    pending: PendingRecord | None = None  # what PreRequest recorded as pending on the pick
    slot: int = -1  # the pick's index slot
    ahead: int = 0  # new blocks this request adds to its pick's queue, until its first response byte
    target: str = ""
    routed_at: float = 0.0  # monotonic time of PreRequest
    events_due: bool = False  # the pick will store blocks the index does not show it holding
    first_byte_at: float = 0.0  # monotonic time of the first response byte (its prefill is done)
    ahead_at_pick: int = 0  # new blocks other routed requests had queued on the pick then
    waiting_at_pick: int = 0  # the pick's scraped waiting queue then
    kv_use_at_pick: float = 0.0  # the pick's scraped KV use then
    latest_decoding_ms: float = -1.0  # how long the latest computed holder has decoded (-1: none)
    holders_at_pick: tuple[int, int] = (0, 0)  # in-flight requests on the pick with this first block:
    # (past their first byte: the engine holds the prefix in use; not yet: still to compute it)


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
    # after a token-producer, if one is configured: its ids are on the body and used as they are
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({TOKENIZED_PROMPT})
    # its response hook marks the prefill done at the first body byte and does nothing after
    FIRST_BYTE_ONLY: ClassVar[bool] = True

    def __init__(self, name: str, params: PrecisePrefixParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        ic = params.indexer_config
        tp = params.token_processor_config
        if ic.token_processor_config is not None:  # the older nesting, under indexerConfig
            if "token_processor_config" in params.model_fields_set and tp != ic.token_processor_config:
                raise ConfigError(
                    f"{self.TYPE}: tokenProcessorConfig and indexerConfig.tokenProcessorConfig differ: "
                    "set one (indexerConfig.tokenProcessorConfig is the older place)"
                )
            tp = ic.token_processor_config
        kbi = ic.kv_block_index_config
        if kbi.redis_config is not None:
            log.warning(
                "precise_prefix_redis_index_ignored",
                address=kbi.redis_config.address,
                detail="each EPP replica keeps its own in-memory index, fed by the same events",
            )
        capacity = min(ic.lru_capacity_per_server, kbi.in_memory_config.size)
        ttl = params.speculative_ttl_seconds
        if params.speculative_ttl:
            try:
                ttl = parse_duration(params.speculative_ttl, "speculativeTTL")
            except ValueError as e:
                raise ConfigError(f"{self.TYPE}: {e}") from e
        max_blocks = ic.max_prefix_blocks_to_match
        if max_blocks is None:
            max_blocks = ic.kv_block_index_config.max_prefix_blocks_to_match
        if max_blocks is None:
            max_blocks = 256
        if max_blocks < 0:
            raise ConfigError(f"{self.TYPE}: indexerConfig.maxPrefixBlocksToMatch must be >= 0")
        # The subscriber: this plugin's own, or that of a kv-events-source in the data layer.
        self._owns_subscriber = not params.kv_events_source
        if params.kv_events_source:
            try:
                source = handle.plugin(params.kv_events_source)
            except KeyError:
                raise ConfigError(
                    f"{self.TYPE}: kvEventsSource {params.kv_events_source!r} is not a plugin declared "
                    "before it"
                ) from None
            subscriber = getattr(source, "subscriber", None)
            if not isinstance(subscriber, KVEventSubscriber):
                raise ConfigError(
                    f"{self.TYPE}: kvEventsSource {params.kv_events_source!r} is not a kv-events-source"
                )
            if subscriber.settings.block_size != tp.block_size:
                raise ConfigError(
                    f"{self.TYPE}: blockSize {tp.block_size} differs from {params.kv_events_source!r}'s "
                    f"{subscriber.settings.block_size}"
                )
            self.hasher = BlockHasher(tp.hash_algo, tp.block_size, tp.hash_seed)
            self.subscriber = subscriber
        else:
            self.hasher, self.subscriber = build_subscriber(self.TYPE, tp, params.kv_events_config, capacity)
        self.index = self.subscriber.index
        self.speculative = params.speculative_indexing
        self.speculative_weight = params.speculative_weight
        pending = self.index.pending
        pending.ttl = ttl
        pending.grace = params.speculative_grace_seconds
        self.block_size = tp.block_size
        self.max_blocks = max_blocks
        self.normalization = params.score_normalization
        tc = params.tokenizer_config
        self.tokens: TokenSource
        if ic.tokenizers_pool_config is not None:
            self.tokens = pool_tokenizer(self.TYPE, ic.tokenizers_pool_config)
        elif tc.mode == "local":
            if not tc.tokenizer_path:
                raise ConfigError(f"{self.TYPE}: tokenizerConfig.mode local needs tokenizerPath")
            try:
                self.tokens = LocalTokenizer(tc.tokenizer_path)
            except Exception as e:
                raise ConfigError(f"{self.TYPE}: cannot load tokenizer {tc.tokenizer_path!r}: {e}") from e
        else:
            self.tokens = ServerTokenizer(timeout=tc.timeout_seconds, scheme=tc.scheme)
        self._key: StateKey[_Prediction] = StateKey(f"{name}/{self.TYPE}")
        self.approximate_when_unheld = params.approximate_when_unheld
        self.sampler = ReuseSampler()  # predicted vs observed reuse, for debug_state only
        self.ahead: dict[str, int] = {}  # endpoint -> new blocks queued there by routed requests
        self.unheld = 0  # requests scored from the approximate index because nobody held them
        self.tokenize_failures = 0
        self._undrained: list[list[Any]] | None = None  # [name, hashes] pending since the last drain
        self.undrained_dropped = 0
        self.sync_dirty: Callable[[], None] = unsynced  # the hub's: "send my changes soon"

    # Lifecycle and endpoints (the data layer runs a referenced kv-events-source) ------------------
    async def start(self) -> None:
        if isinstance(self.tokens, UdsTokenizer):
            try:
                await self.tokens.start()
            except RuntimeError as e:
                raise ConfigError(f"{self.TYPE}: indexerConfig.tokenizersPoolConfig.{e}") from e
        if self._owns_subscriber:
            await self.subscriber.start()

    async def stop(self) -> None:
        if self._owns_subscriber:
            await self.subscriber.stop()
        if isinstance(self.tokens, (ServerTokenizer, UdsTokenizer)):
            await self.tokens.close()

    def endpoint_added(self, endpoint: Endpoint) -> None:
        if self._owns_subscriber:
            self.subscriber.add(endpoint)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        if self._owns_subscriber:
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
        slots: list[int] = []  # -1: not indexed
        untrusted = 0
        for ep in endpoints:
            st = states.get(ep.metadata.name)
            if trusted and st is not None:
                slots.append(st.slot)
                mask |= 1 << st.slot
                if not st.consistent:
                    slots[-1] = -2 - st.slot  # indexed, but not trusted on its own
                    untrusted += 1
            else:
                slots.append(-1)
                untrusted += 1
        counts = index.match(hashes, mask) if mask and hashes else {}
        spec = self.speculative and mask and hashes and index.pending.bits
        if spec:
            index.pending.expire(time.monotonic())
        spec_counts = index.match(hashes, mask, pending=True) if spec else counts
        # nobody holds even the first block: the prefix goes back where it was last routed
        unheld = self.approximate_when_unheld and not spec_counts and trusted and bool(hashes)
        if unheld:
            self.unheld += 1
        approx = state.attributes(PREFIX_MATCH) if untrusted or unheld else {}
        zero = PrefixMatchInfo(0, total, bs)
        values: dict[Hashable, PrefixMatchInfo] = {}
        by_name: dict[str, int] = {}
        confirmed: dict[str, int] = {}
        fallback: list[str] = []
        for ep, slot in zip(endpoints, slots, strict=True):
            if slot >= 0:
                n = spec_counts.get(slot, 0)
                if n:
                    values[ep] = PrefixMatchInfo(n, total, bs)
                    by_name[ep.metadata.name] = n
                    confirmed[ep.metadata.name] = counts.get(slot, 0)
                elif unheld and (info := approx.get(ep)) is not None and info.match_blocks:
                    # scored as the approximate index's run; predicted 0 (the events say it is gone)
                    a = min((info.match_blocks * info.block_size_tokens) // bs, total)
                    values[ep] = PrefixMatchInfo(a, total, bs) if a else zero
                else:
                    values[ep] = zero
                continue
            # untrusted: the larger of what the events still say and the approximate index's run
            name = ep.metadata.name
            fallback.append(name)
            m.PRECISE_FALLBACKS.labels(name).inc()
            n = spec_counts.get(-2 - slot, 0) if slot < -1 else 0
            of = total
            info = approx.get(ep)
            if info is not None and info.match_blocks:
                # the approximate index's blocks, in engine blocks; its total when ours is unknown
                approx_total = (info.total_blocks * info.block_size_tokens) // bs
                if not trusted:
                    of = approx_total
                n = max(n, min((info.match_blocks * info.block_size_tokens) // bs, of))
            if n:
                values[ep] = PrefixMatchInfo(n, of, bs)
                by_name[name] = n
                confirmed[name] = n
            else:
                values[ep] = zero
        state.set_attributes(PRECISE_PREFIX_MATCH, values)
        top = (
            total if trusted else max((v.total_blocks for v in values.values()), default=0)
        )  # untokenised: the approximate index's length is all there is
        state.put(
            self._key,
            _Prediction(
                len(ids),
                by_name,
                confirmed,
                frozenset(fallback),
                top,
                cap if trusted else top,
                hashes if trusted else [],
            ),
        )

    # Scorer -----------------------------------------------------------------------------------
    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(PRECISE_PREFIX_MATCH)
        if not infos:
            return [0.0] * len(endpoints)
        blocks: list[float] = [
            info.match_blocks if info is not None else 0 for info in map(infos.get, endpoints)
        ]
        w = self.speculative_weight
        prediction = state.get(self._key)
        if w < 1.0 and prediction is not None:
            # a pending block counts w of a reported one
            held = prediction.confirmed_by_name
            blocks = [
                (c := held.get(ep.metadata.name, 0)) + w * (b - c) if b else 0.0
                for b, ep in zip(blocks, endpoints, strict=True)
            ]
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
        target = primary.target_endpoints[0]
        name = target.metadata.name
        matched = prediction.blocks_by_name.get(name, 0)
        reported = prediction.confirmed_by_name.get(name, 0)
        bs = self.block_size
        prediction.predicted_routed = min(matched, prediction.cap) * bs
        prediction.predicted_confirmed = min(reported, prediction.cap) * bs
        st = self.index.states.get(name)
        hashes = prediction.hashes
        ahead = self.ahead.get(name, 0)
        mt = target.metrics
        if st is not None and hashes and name not in prediction.fallback:
            # eviction-aware: what of the run will still be there when this request runs
            free = max(mt.cache_num_blocks - self.index.blocks(st.slot), 0)
            # cached blocks in the engine's free queue: KV use counts the blocks running requests
            # reference, the rest are free (never used, or cached and evictable); unknown size: no bound
            cached_free = (
                max(int(mt.cache_num_blocks * (1.0 - mt.kv_cache_usage_percent)) - free, 0)
                if mt.cache_num_blocks
                else -1
            )
            kept = self.surviving(st.slot, hashes, matched, ahead - free, cached_free)
            prediction.predicted = min(kept, prediction.cap) * bs
        else:
            prediction.predicted = prediction.predicted_routed
        m.PRECISE_PREDICTED_TOKENS.observe(prediction.predicted)
        now = time.monotonic()
        # events are due only if the engine will store a block it does not hold yet: a request it
        # has fully cached publishes nothing, and that silence is not a silent publisher.  They are
        # awaited from its first response byte (response_body), not from now: it may queue there.
        prediction.events_due = reported < prediction.total_blocks
        prediction.target = name
        prediction.routed_at = now
        prediction.ahead_at_pick = ahead
        prediction.waiting_at_pick = mt.waiting_queue_size
        prediction.kv_use_at_pick = mt.kv_cache_usage_percent
        if st is not None and hashes:
            computed, computing, latest = self.index.pending.holders(st.slot, hashes[0])
            prediction.holders_at_pick = (computed, computing)
            prediction.latest_decoding_ms = round((now - latest) * 1000, 1) if latest else -1.0
            prediction.slot = st.slot
            # the blocks it will allocate before its first token: queued ahead of later requests
            prediction.ahead = max(-(-prediction.prompt_tokens // bs) - matched, 0)
            if prediction.ahead:
                self.ahead[name] = ahead + prediction.ahead
            if self.speculative:
                # all its blocks: pending on the pick while it is in flight, even those the engine
                # reports now (evicted while the request waits, they will be computed again there)
                prediction.pending = self.index.pending.add(st.slot, hashes, now)
                undrained = self._undrained
                if undrained is not None and prediction.pending is not None:
                    if len(undrained) < MAX_UNDRAINED:
                        undrained.append([name, hashes])
                        self.sync_dirty()
                    else:
                        self.undrained_dropped += 1

    def surviving(
        self, slot: int, hashes: Sequence[int], run: int, evictions: int, cached_free: int = -1
    ) -> int:
        """How many of the first ``run`` blocks the endpoint will still hold when this request runs.

        A block a request still in flight there holds or will compute stays.  A block pending only
        on a request that has ended (its grace period, for events still on the wire) stays unless
        the events have since reported it removed: evicted after its request freed it.  A block the
        events report goes if fewer than ``evictions`` blocks leave the free queue before it: the
        blocks older than it, but no more than the cached blocks in the free queue (``cached_free``,
        -1 unknown), since the older ones a running request references are not evictable.  With the
        KV cache full the free queue is short, and a block nobody in flight holds is the next to go
        (at 48 req/s such a block with 8 or more requests waiting was always gone)."""
        pending = self.index.pending
        index = self.index
        for j in range(run):
            h = hashes[j]
            if pending.in_flight(slot, h):
                continue
            age = index.older(slot, h)
            if age < 0:
                if index.evicted(slot, h) or not pending.holds(slot, h):
                    return j
                continue
            if 0 <= cached_free < age:
                age = cached_free
            if age < evictions:
                return j
        return run

    def _release_ahead(self, prediction: _Prediction) -> None:
        if prediction.ahead:
            subtract(self.ahead, prediction.target, prediction.ahead)
            prediction.ahead = 0

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None:
        """The first response byte: the prefill is done, its blocks are no longer queued ahead."""
        if chunk or response.end_of_stream:
            prediction = state.get(self._key)
            if prediction is not None:
                if not prediction.first_byte_at:
                    prediction.first_byte_at = time.monotonic()
                    if prediction.pending is not None:
                        prediction.pending.computed = True
                        prediction.pending.computed_at = prediction.first_byte_at
                    if prediction.events_due and response.status < 300:
                        # served: its BlockStored went out before this byte; silence from here on
                        # is the publisher's (kvEventsConfig.silenceTimeoutSeconds)
                        self.subscriber.expect_events(
                            prediction.target, prediction.routed_at, prediction.first_byte_at
                        )
                self._release_ahead(prediction)

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        prediction = state.get(self._key)
        if prediction is None or prediction.predicted < 0:
            return
        self._release_ahead(prediction)
        if not response.end_of_stream:
            return
        if prediction.pending is not None:
            self.index.pending.end(prediction.pending, time.monotonic())
        st = self.index.states.get(prediction.target)
        if prediction.hashes and st is not None and st.slot == prediction.slot:
            # the engine frees the request's blocks now, tail first: the prefix is the newest
            self.index.touch(st.slot, reversed(prediction.hashes))
        usage = response.usage
        if usage is None or usage.cached_tokens is None:
            self.sampler.missing()
            return
        observed = usage.cached_tokens
        m.PRECISE_OBSERVED_TOKENS.observe(observed)
        m.PRECISE_PREDICTION_ERROR_TOKENS.observe(abs(prediction.predicted - observed))
        first = prediction.first_byte_at
        self.sampler.add(
            (
                prediction.predicted,
                prediction.predicted_routed,
                prediction.predicted_confirmed,
                observed,
                prediction.prompt_tokens,
                prediction.ahead_at_pick,
                round((first - prediction.routed_at) * 1000, 1) if first else -1.0,
                prediction.waiting_at_pick,
                round(prediction.kv_use_at_pick, 3),
                *prediction.holders_at_pick,
                prediction.latest_decoding_ms,
            )
        )

    # Replicated (module docstring) -------------------------------------------------------------
    @property
    def sync_key(self) -> str:
        return f"{self.TYPE}/{self.typed_name.name}"

    def drain(self) -> list[Any]:
        out, self._undrained = self._undrained, []
        return out or []

    def apply(self, origin: str, deltas: list[Any]) -> None:
        """Add a peer's routed requests as pending here; ValueError leaves the pending blocks as they were."""
        self._add_routed(origin, parse_routed(deltas, "precise-prefix delta"))

    def forget(self, origin: str) -> None:
        self.index.pending.forget(origin)

    def snapshot(self) -> list[list[Any]]:
        names = {st.slot: name for name, st in self.index.states.items()}
        self.index.pending.expire(time.monotonic())
        records = self.index.pending.live_records()
        return [[names[r.slot], list(r.hashes)] for r in records if r.slot in names]

    def restore(self, snapshot: Any) -> None:
        self._add_routed(SNAPSHOT_ORIGIN, parse_routed(snapshot, "precise-prefix snapshot"))

    def _add_routed(self, origin: str, routed: list[tuple[str, list[int]]]) -> None:
        if not routed or not self.speculative:  # pending blocks are off: nothing would read them
            return
        pending = self.index.pending
        slot_of = self.index.slot_of
        now = time.monotonic()
        for name, hashes in routed:
            slot = slot_of(name)
            if slot is not None:
                pending.add_peer(origin, slot, hashes, now)

    # DebugState -------------------------------------------------------------------------------
    def debug_state(self) -> dict[str, Any]:
        self.index.pending.expire(time.monotonic())  # expiry is lazy: settle it before reporting
        return {
            "hashAlgo": self.hasher.algo,
            "blockSize": self.block_size,
            "tokenizer": type(self.tokens).__name__,
            "tokenizeFailures": self.tokenize_failures,
            **self.sampler.state(),
            "approximateWhenUnheld": {"enabled": self.approximate_when_unheld, "requests": self.unheld},
            "queuedNewBlocks": dict(self.ahead),
            "speculative": {
                "enabled": self.speculative,
                "weight": self.speculative_weight,
                "ttlSeconds": self.index.pending.ttl,
                "graceSeconds": self.index.pending.grace,
                "pendingBlocks": len(self.index.pending),
                "pendingRequests": self.index.pending.records(),
            },
            **self.subscriber.debug_state(),
        }
