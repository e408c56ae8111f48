"""``approx-prefix-cache-producer``: estimate how much of each prompt every endpoint has cached."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.director.prefix import native
from epp.director.prefix.hashing import AVERAGE_CHARS_PER_TOKEN, hash_request
from epp.director.prefix.index import PrefixIndex
from epp.errors import ConfigError
from epp.metrics.series import PREFIX_INDEXER_HIT_BYTES, PREFIX_INDEXER_HIT_RATIO, PREFIX_INDEXER_SIZE
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.replicated import merge_routed, parse_routed, unsynced
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult

DEFAULT_BLOCK_SIZE_TOKENS: Final = 16  # vLLM's default
DEFAULT_MAX_PREFIX_BLOCKS: Final = 256
DEFAULT_LRU_CAPACITY_PER_SERVER: Final = 31250  # ~500k tokens of H100 KV-cache / 16 tokens per block
# insertions kept for the sync hub between two drains; past it new ones are dropped (and counted)
MAX_UNDRAINED: Final = 65536
# A held chain goes to the peers whole at most once per this many seconds per replica (``_keep``)
REFRESH_HELD_S: Final = 1.0
_REFRESHED_MAX: Final = 65536  # (endpoint, deepest held block) keys remembered; then forgotten at once
PREFILL_PROFILE: Final = "prefill"  # P/D: the prefill endpoint's cache is recorded too
_INFOS_MAX: Final = 4096  # distinct (matched, total, block size) infos kept between requests

log = structlog.get_logger(__name__)
_logged_loops = False  # which prefix loops run (C or Python) is said once per process


def _log_loops() -> None:
    global _logged_loops
    if _logged_loops:
        return
    _logged_loops = True
    if native.NATIVE is None:  # not built: worth a warning (EPP_PURE_PYTHON is a choice)
        log.warning("prefix_loops", implementation=native.IMPLEMENTATION, reason=native.REASON)
    else:
        log.info("prefix_loops", implementation=native.IMPLEMENTATION, reason=native.REASON or None)


class ApproxPrefixCacheParams(PluginParams):
    """GIE's parameters and defaults (``blockSize`` is the deprecated size in characters)."""

    auto_tune: bool = True
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    block_size: int = 0
    max_prefix_blocks_to_match: int = DEFAULT_MAX_PREFIX_BLOCKS
    max_prefix_tokens_to_match: int = 0
    lru_capacity_per_server: int = DEFAULT_LRU_CAPACITY_PER_SERVER


# What PreRequest needs from PrepareRequestData: the hashes, and endpoint name → matched blocks
# (only endpoints with a match).  A tuple in the request's CycleState: an object with slots cost
# a Python ``__init__`` a request (~1.5k instructions more).
_RequestPrefix = tuple[list[int], dict[str, int]]


class ApproxPrefixCacheProducer(PluginBase):
    """Approximate prefix-cache index.  Type ``approx-prefix-cache-producer``.

    Before scheduling, the request's user input (see ``epp.director.prefix.hashing.user_input_bytes``) is
    cut into blocks of ``blockSize * 4`` bytes (4 characters per token), at most
    ``maxPrefixBlocksToMatch`` of them, and hashed as a chain of xxHash64 values seeded by
    the target model and ``cache_salt``.  Walking the chain until the first block no
    endpoint holds, each endpoint gets ``PrefixMatchInfo(match_blocks, total_blocks,
    block_size)``.  After scheduling (PreRequest), the hashes are added to the LRU of the
    primary target, and of the first target of a profile named ``prefill`` if any.  When
    an endpoint leaves the datastore (EndpointObserver), its entries are dropped.

    ``blockSize`` in tokens is the first candidate's ``cache_block_size`` when
    ``autoTune`` and known, else ``blockSizeTokens``.  ``maxPrefixTokensToMatch > 0``
    overrides the block limit with ``tokens // blockSize``.  LRU capacity per endpoint:
    with ``autoTune`` and a known ``cache_num_blocks``, that block count, else
    ``lruCapacityPerServer`` (GIE ignores the parameter and uses 31250; see
    docs/decisions-scheduling.md).  Metrics: ``prefix_indexer_size`` (read at scrape from
    the index that changed last), ``prefix_indexer_hit_ratio`` and ``prefix_indexer_hit_bytes``
    (per request); running totals of the same hits in ``debug_state`` (``/debug/plugins/state``).
    Produces: ``PREFIX_MATCH``.  Consumes: nothing.
    Parameters: ``autoTune`` (true), ``blockSizeTokens`` (16), ``blockSize`` (deprecated,
    characters), ``maxPrefixBlocksToMatch`` (256), ``maxPrefixTokensToMatch`` (0),
    ``lruCapacityPerServer`` (31250).

    Active-active replicas (``epp.plugin.replicated.Replicated``): every insertion routing makes
    here is kept, as ``[endpoint name, hashes]``, for the sync hub's next ``drain``: the blocks
    past those the endpoint already held, or the whole chain (the request's own hash list, not a
    copy) when this replica has not sent that held part whole within ``REFRESH_HELD_S``
    (``_keep``); ``apply`` inserts a peer's into this index as if routed here
    (same live-endpoint check, LRU and capacity), so a prompt routed by any replica hits on all.
    ``forget`` is a no-op: a prefix a departed peer routed is still cached on that endpoint,
    and the LRU ages it out as any other.  ``snapshot`` is every endpoint's hashes in LRU order
    (bounded by the capacities), ``restore`` re-inserts them.  Insertions are kept only once a
    hub has drained (no hub: no cost) and at most ``MAX_UNDRAINED`` between two drains.
    """

    TYPE: ClassVar[str] = "approx-prefix-cache-producer"
    PARAMS: ClassVar[type[PluginParams]] = ApproxPrefixCacheParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    # pre_request only records the routed prefix (director.api): it may run after the routing
    # reply is written, and always runs before the next request is routed
    AFTER_REPLY: ClassVar[bool] = True

    def __init__(self, name: str, params: ApproxPrefixCacheParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        if params.block_size > 0 and params.block_size_tokens <= 0:
            raise ConfigError(
                f"invalid configuration: BlockSize ({params.block_size}) is deprecated; please use "
                "BlockSizeTokens instead to define the cache block size in tokens"
            )
        if not params.auto_tune and params.block_size_tokens <= 0:
            raise ConfigError(
                "invalid configuration: BlockSizeTokens must be > 0 when AutoTune is disabled "
                f"(current value: {params.block_size_tokens})"
            )
        if params.max_prefix_tokens_to_match < 0:
            raise ConfigError(
                "invalid configuration: MaxPrefixTokensToMatch must be >= 0 "
                f"(current value: {params.max_prefix_tokens_to_match})"
            )
        if params.max_prefix_blocks_to_match < 0:
            raise ConfigError(
                "invalid configuration: MaxPrefixBlocksToMatch must be >= 0 "
                f"(current value: {params.max_prefix_blocks_to_match})"
            )
        if params.lru_capacity_per_server <= 0:
            raise ConfigError(
                "invalid configuration: LRUCapacityPerServer must be > 0 "
                f"(current value: {params.lru_capacity_per_server})"
            )
        self.auto_tune = params.auto_tune
        self.block_size_tokens = params.block_size_tokens
        self.max_prefix_blocks = params.max_prefix_blocks_to_match
        self.max_prefix_tokens = params.max_prefix_tokens_to_match
        self.lru_capacity = params.lru_capacity_per_server
        self.index = PrefixIndex()
        # ``prefix_indexer_size`` reads the index that changed last, at scrape time (one
        # ``set`` a request was three Python calls); the bound ``__len__`` made once.
        self._size = self.index.__len__
        _log_loops()
        # Names of live endpoints once the datastore tells us about them (None: no observer
        # wiring, record everything).  Guards against re-creating the entries of an endpoint
        # removed between scheduling and PreRequest.
        self._live: dict[str, Endpoint] | None = None
        self._undrained: list[list[Any]] | None = None  # [name, hashes] since the last drain
        self.undrained_dropped = 0
        self.sync_dirty: Callable[[], None] = unsynced  # the hub's: "send my changes soon"
        # (endpoint name, deepest held block) -> when this replica last sent that chain whole
        self._refreshed: dict[tuple[str, int], float] = {}
        self.clock: Callable[[], float] = time.monotonic  # tests pin it
        self.sync_blocks_sent = 0  # blocks kept for the peers
        self.sync_blocks_held = 0  # blocks not kept: the endpoint held them, sent whole lately
        self._state_key: StateKey[_RequestPrefix] = StateKey(f"{name}/{self.TYPE}")
        # PrefixMatchInfo is immutable: one object per (matched, total, block size), shared by
        # every request and endpoint with those numbers, so a request allocates none.
        self._infos: dict[tuple[int, int, int], PrefixMatchInfo] = {}
        # Hit-rate counters for /debug/plugins/state, three additions per routed request (PreRequest).
        self.lookups = 0  # requests routed after a lookup
        self.lookups_hit = 0  # of which the picked endpoint held at least the first block
        self.blocks_looked_up = 0  # prompt blocks hashed and looked up
        self.blocks_hit = 0  # of which the picked (primary) endpoint held

    def debug_state(self) -> dict[str, Any]:
        """The prefix index's size (block hashes known, entries over all endpoints) and its hit
        rate since start: of the prompt blocks looked up for routed requests, the share the
        *picked* endpoint held (what ``prefix_indexer_hit_ratio`` observes per request; the best
        endpoint may have held more when a load scorer outweighed the prefix scorer), and which
        implementation runs the hashing and index loops ("c", or "python" and why)."""
        index = self.index
        looked_up, hit = self.blocks_looked_up, self.blocks_hit
        loops: dict[str, Any] = {"implementation": index.implementation}
        if index.implementation != "c":
            loops["reason"] = native.REASON
        return {
            "sync": {"blocksSent": self.sync_blocks_sent, "blocksHeldNotSent": self.sync_blocks_held},
            "loops": loops,
            "indexedHashes": index.reverse_size,
            "entries": len(index),
            "endpoints": len(index.servers()),
            "hitRate": {
                "requests": self.lookups,
                "requestsWithHit": self.lookups_hit,
                "blocksLookedUp": looked_up,
                "blocksHit": hit,
                "ratio": round(hit / looked_up, 4) if looked_up else None,
            },
        }

    # helpers ------------------------------------------------------------------------
    def block_size(self, endpoints: Sequence[Endpoint]) -> int:
        """Tokens per block: the first endpoint's engine block size when auto-tuned and known."""
        if self.auto_tune and endpoints:
            bs = endpoints[0].metrics.cache_block_size
            if bs > 0:
                return bs
        return self.block_size_tokens

    def capacity(self, endpoint: Endpoint) -> int:
        """LRU entries for ``endpoint``: its engine's KV block count when auto-tuned and known."""
        if self.auto_tune:
            blocks = endpoint.metrics.cache_num_blocks
            if blocks > 0:
                return blocks
        return self.lru_capacity

    # DataProducer -------------------------------------------------------------------
    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        self.prepare(state, request, endpoints)

    def prepare(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        """The synchronous body of ``prepare_request_data`` (no await inside; benchmarks call it)."""
        block_size = self.block_size_tokens  # ``block_size(endpoints)``, inlined
        if self.auto_tune and endpoints:
            bs = endpoints[0].metrics.cache_block_size
            if bs > 0:
                block_size = bs
        max_blocks = self.max_prefix_blocks
        if self.max_prefix_tokens > 0 and block_size > 0:
            max_blocks = self.max_prefix_tokens // block_size
        hashes = hash_request(request, block_size, max_blocks)
        total = len(hashes)
        index = self.index
        counts = index.match(hashes) if hashes else None

        # One shared info object for every endpoint without a match: no per-endpoint allocation.
        values: dict[Any, PrefixMatchInfo] = dict.fromkeys(endpoints, self._info(0, total, block_size))
        matches: dict[str, int] = {}
        if counts:
            by_name: dict[str, Endpoint] | None = None
            for slot, n in counts.items():
                name = index.name_of(slot)
                matches[name] = n
                ep = index.endpoint_of(slot)
                if ep is None or ep not in values:  # a different object for this name
                    if by_name is None:
                        by_name = {e.metadata.name: e for e in endpoints}
                    ep = by_name.get(name)
                    if ep is None:
                        continue
                values[ep] = self._info(n, total, block_size)
        state.set_attributes(PREFIX_MATCH, values)
        state.put(self._state_key, (hashes, matches))

    prepare_request_data_now = prepare  # never waits: the director calls it without a coroutine

    def _info(self, matched: int, total: int, block_size: int) -> PrefixMatchInfo:
        """The shared ``PrefixMatchInfo`` with these numbers."""
        key = (matched, total, block_size)
        info = self._infos.get(key)
        if info is None:
            if len(self._infos) >= _INFOS_MAX:
                self._infos.clear()
            info = self._infos[key] = PrefixMatchInfo(matched, total, block_size)
        return info

    # PreRequest ---------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        primary = result.profile_results.get(result.primary_profile_name)
        if primary is None or not primary.target_endpoints:
            return
        prefix = state.get(self._state_key)
        if prefix is None:
            return  # prepare did not run (timed out or failed): nothing to record
        hashes, matches = prefix
        target = primary.target_endpoints[0]
        targets = [target]
        prefill_profile = PREFILL_PROFILE if result.disagg is None else result.disagg.prefill_profile
        prefill = result.profile_results.get(prefill_profile)
        if prefill is not None and prefill.target_endpoints:
            targets.append(prefill.target_endpoints[0])
        if hashes:
            live = self._live
            undrained = self._undrained
            for ep in targets:
                name = ep.metadata.name
                if live is None or name in live:
                    self.index.add(name, ep, hashes, self.capacity(ep))
                    if undrained is not None:
                        self._keep(undrained, name, hashes, matches.get(name, 0))
            if PREFIX_INDEXER_SIZE.function is not self._size:
                PREFIX_INDEXER_SIZE.set_function(self._size)
        total = len(hashes)
        matched = matches.get(target.metadata.name, 0)
        self.lookups += 1
        self.lookups_hit += matched > 0
        self.blocks_looked_up += total
        self.blocks_hit += matched
        block_size = self.block_size_tokens  # ``block_size(primary.target_endpoints)``, inlined
        if self.auto_tune:
            bs = target.metrics.cache_block_size
            if bs > 0:
                block_size = bs
        PREFIX_INDEXER_HIT_BYTES.observe(matched * (block_size * AVERAGE_CHARS_PER_TOKEN))
        if total > 0:
            PREFIX_INDEXER_HIT_RATIO.observe(matched / total)

    def _keep(self, undrained: list[list[Any]], name: str, hashes: list[int], held: int) -> None:
        """Keep for the peers what this routing taught about ``name``: the blocks past the ``held``
        it already had, or the whole chain when this replica has not sent that held part itself
        within ``REFRESH_HELD_S``.

        A peer's cost is the content it inserts (docs/decisions.md, eighteenth pass: 7.3 µs per
        peer request, the whole chain every time), and the held part is usually most of it (a
        shared system prompt).  The peers already hold it: whoever routed it first sent it whole.
        What they would miss is its LRU refresh, so each replica still sends every held chain
        whole once per interval (per endpoint and deepest held block): a peer's LRU order lags
        its sender's by at most the interval, and a peer that missed the first sender (a
        partition, a later start) learns the chain from any replica within it.
        """
        sent = hashes
        whole: tuple[str, int] | None = None  # the held part's key, when it goes whole now
        now = 0.0
        if held:
            key = (name, hashes[held - 1])
            now = self.clock()
            last = self._refreshed.get(key)
            if last is not None and now - last < REFRESH_HELD_S:
                sent = hashes[held:]
                self.sync_blocks_held += held
                if not sent:
                    return
            else:
                whole = key
        if len(undrained) >= MAX_UNDRAINED:
            self.undrained_dropped += 1  # and not noted as sent whole: the next request sends it
            return
        if whole is not None:
            refreshed = self._refreshed
            if len(refreshed) >= _REFRESHED_MAX:
                refreshed.clear()
            refreshed[whole] = now
        undrained.append([name, sent])
        self.sync_blocks_sent += len(sent)
        self.sync_dirty()

    # EndpointObserver ---------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        if self._live is None:
            self._live = {}
        self._live[endpoint.metadata.name] = endpoint

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        if self._live is not None:
            self._live.pop(endpoint.metadata.name, None)
        self.index.remove_server(endpoint.metadata.name)
        PREFIX_INDEXER_SIZE.set_function(self._size)

    # Replicated ---------------------------------------------------------------------
    @property
    def sync_key(self) -> str:
        return f"{self.TYPE}/{self.typed_name.name}"

    def drain(self) -> list[Any]:
        """``[endpoint name, hashes]`` per endpoint routing inserted on since the last call, its
        insertions merged into one chain (``merge_routed``: a peer inserts each block once)."""
        out, self._undrained = self._undrained, []
        return merge_routed(out) if out else []

    def apply(self, origin: str, deltas: list[Any]) -> None:
        """Insert a peer's routed prefixes as if routed here; ValueError leaves the index as it was."""
        self._insert(parse_routed(deltas, "approx-prefix delta"))

    def forget(self, origin: str) -> None:
        """Nothing: what ``origin`` routed is still cached on the endpoint; the LRUs age it out."""

    def snapshot(self) -> dict[str, list[int]]:
        return self.index.dump()

    def restore(self, snapshot: Any) -> None:
        if not isinstance(snapshot, dict):
            kind = type(snapshot).__name__
            raise ValueError(f"approx-prefix snapshot: expected a map of endpoint hashes, got {kind}")  # noqa: TRY004
        self._insert(parse_routed([[n, h] for n, h in snapshot.items()], "approx-prefix snapshot"))

    def _insert(self, insertions: list[tuple[str, list[int]]]) -> None:
        live = self._live
        index = self.index
        for name, hashes in insertions:
            if live is None:
                index.add(name, None, hashes, self.lru_capacity)
            else:
                ep = live.get(name)
                if ep is not None:
                    index.add(name, ep, hashes, self.capacity(ep))
        if insertions:
            PREFIX_INDEXER_SIZE.set_function(self._size)


class MulticlusterApproxPrefixCacheProducer(ApproxPrefixCacheProducer):
    """llm-d-router's ``multicluster-approx-prefix-cache-producer``: the same index over
    endpoints that are peer clusters (``multicluster-file-discovery``), with the same
    parameters; a cluster's prefix cache is learned from this EPP's routing as a pod's is."""

    TYPE: ClassVar[str] = "multicluster-approx-prefix-cache-producer"
