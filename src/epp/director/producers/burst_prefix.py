"""``burst-prefix-cache-producer`` (llm-d-router v0.10): co-locate bursts of prompt-sharing requests.

When many requests sharing a prompt arrive at once (an RL rollout step's ``n`` samples), every
replica's cache is cold, a cache scorer scores them all 0 and load balancing scatters them: the
shared prompt is prefilled on several replicas.  This producer holds each request for up to
``windowDurationMs``, then places the whole window jointly (``epp.director.prefix.burst``) and publishes
``PREFIX_MATCH`` as a full match on the request's assigned replica and zero elsewhere, which
``prefix-cache-scorer`` (``prefixMatchInfoProducerName: burst-prefix-cache-producer``) scores.
A request sharing nothing with the window, or with no prefix, gets zero everywhere.

Prefix blocks: the prompt's token ids when a ``token-producer`` wrote them (``blockSizeTokens``
ids a block), else the request's user input bytes (``blockSizeTokens * 4`` bytes a block, what
upstream's ``estimate`` token backend packs into pseudo-tokens); a trailing partial block
counts, as upstream's; at most ``maxPrefixTokensToMatch / blockSizeTokens`` blocks (2048 when
0).  Hashes chain from the target model and ``cache_salt`` (``epp.director.prefix.hashing``).

The window is upstream's: opened by the first request, sealed ``windowDurationMs`` later; a full
window (``maxBatchSize``) fails the request's production (logged; it routes without affinity).
As upstream, it declares its own producer timeout, the window + 300 ms (``produce_timeout``),
which the director honours instead of its 0.4 s default.

Active-active replicas share nothing here: a window lives ``windowDurationMs`` and places only the
requests this replica received in it; what its placements teach is shared by the producers that
remember them (``approx-prefix-cache-producer``, the pending precise-prefix blocks).
"""

from __future__ import annotations

import asyncio
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from xxhash import xxh64_intdigest

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.datalayer.kvevents.tokens import TOKENIZED_PROMPT
from epp.director.prefix.burst import UNLIMITED, Entry, assign
from epp.director.prefix.hashing import AVERAGE_CHARS_PER_TOKEN, chain_hashes, prefix_seed, user_input_bytes
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

DEFAULT_MAX_PREFIX_BLOCKS: Final = 2048
MAX_WINDOW_MS: Final = 10000  # every request waits up to the window: a huge one would stall all
PRODUCE_TIMEOUT_MARGIN: Final = 0.3  # seconds upstream adds to the window for its producer timeout


class BurstPrefixParams(PluginParams):
    """llm-d-router's parameters and defaults."""

    window_duration_ms: int = 100
    max_per_replica: int = UNLIMITED
    block_size_tokens: int = 64
    max_prefix_tokens_to_match: int = 0
    min_colocate_blocks: int = 0
    max_batch_size: int = 1000
    balance_by: Literal["requests", "tokens", ""] = "requests"


@dataclass(slots=True, eq=False)
class _Batch:
    entries: list[Entry] = field(default_factory=list)
    sealed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False


def _check(params: BurstPrefixParams) -> None:
    """Upstream's construction checks, each naming its field."""
    w = params.window_duration_ms
    if not 0 < w <= MAX_WINDOW_MS:
        raise ConfigError(f"windowDurationMs must be in 1..{MAX_WINDOW_MS} (current value: {w})")
    if params.max_per_replica != UNLIMITED and params.max_per_replica < 1:
        raise ConfigError(
            f"maxPerReplica must be -1 (unlimited) or >= 1 (current value: {params.max_per_replica})"
        )
    bs = params.block_size_tokens
    if bs <= 0:
        raise ConfigError(f"blockSizeTokens must be > 0 (current value: {bs})")
    mt = params.max_prefix_tokens_to_match
    if mt < 0:
        raise ConfigError(f"maxPrefixTokensToMatch must be >= 0 (current value: {mt})")
    if 0 < mt < bs:
        raise ConfigError(
            f"maxPrefixTokensToMatch ({mt}) must be 0 or >= blockSizeTokens ({bs}); "
            "a smaller positive value yields zero prefix blocks"
        )
    if params.min_colocate_blocks < 0:
        raise ConfigError(f"minColocateBlocks must be >= 0 (current value: {params.min_colocate_blocks})")
    if params.max_batch_size != UNLIMITED and params.max_batch_size < 1:
        raise ConfigError(
            f"maxBatchSize must be -1 (unlimited) or >= 1 (current value: {params.max_batch_size})"
        )


def _token_bytes(ids: Sequence[int]) -> bytes | None:
    try:
        packed = array("I", ids)
    except (OverflowError, TypeError):
        return None  # not uint32 token ids: hash the text instead
    if sys.byteorder == "big":  # pragma: no cover - little-endian everywhere we run
        packed.byteswap()
    return packed.tobytes()


def block_hashes(request: InferenceRequest, block_tokens: int, max_blocks: int) -> tuple[int, ...]:
    """The request's chained prefix block hashes (module docstring); empty without a prompt."""
    body = request.body
    if body is None or max_blocks <= 0:
        return ()
    data = _token_bytes(body.token_ids) if body.token_ids else None
    if data is None:
        data = user_input_bytes(body)
    if not data:
        return ()
    block_bytes = block_tokens * AVERAGE_CHARS_PER_TOKEN  # 4 bytes a token id, 4 characters a token
    seed = prefix_seed(request)
    if len(data) < block_bytes:  # upstream hashes a short prompt as one partial block
        return (xxh64_intdigest(data, seed),)
    return tuple(chain_hashes(data, block_bytes, max_blocks, seed))


class BurstPrefixCacheProducer(PluginBase):
    """Type ``burst-prefix-cache-producer``.  Produces ``PREFIX_MATCH``; reads the token ids.

    Parameters (upstream's defaults): ``windowDurationMs`` (100, 1..10000), ``maxPerReplica``
    (-1 = the whole group on one replica, else >= 1), ``blockSizeTokens`` (64),
    ``maxPrefixTokensToMatch`` (0 = 2048 blocks, else >= blockSizeTokens), ``minColocateBlocks``
    (0 = only identical prompts are placed), ``maxBatchSize`` (1000, -1 = unlimited),
    ``balanceBy`` (``requests`` or ``tokens``).
    """

    TYPE: ClassVar[str] = "burst-prefix-cache-producer"
    PARAMS: ClassVar[type[PluginParams]] = BurstPrefixParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    # after a token-producer when one is configured (its ids are hashed), without requiring one
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({TOKENIZED_PROMPT})

    def __init__(self, name: str, params: BurstPrefixParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        _check(params)
        self.window = params.window_duration_ms / 1000
        self.k = params.max_per_replica
        self.block_size = params.block_size_tokens
        mt = params.max_prefix_tokens_to_match
        self.max_blocks = mt // self.block_size if mt > 0 else DEFAULT_MAX_PREFIX_BLOCKS
        self.min_colocate = params.min_colocate_blocks
        self.max_batch = params.max_batch_size
        self.by_tokens = params.balance_by == "tokens"
        self._batch: _Batch | None = None
        self.windows = 0  # sealed windows, for /debug/plugins/state
        self.requests = 0
        self.steered = 0  # requests given an affinity
        self.rejected = 0  # requests refused by a full window

    def produce_timeout(self) -> float:
        """Upstream's ``ProduceTimeout``: the window plus a margin (seconds); the director runs
        this producer under it (``epp.director.api.TimeoutAwareProducer``)."""
        return self.window + PRODUCE_TIMEOUT_MARGIN

    def debug_state(self) -> dict[str, Any]:
        open_batch = self._batch
        return {
            "windowsSealed": self.windows,
            "requests": self.requests,
            "steered": self.steered,
            "rejectedBatchFull": self.rejected,
            "waiting": len(open_batch.entries) if open_batch is not None else 0,
        }

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        hashes = block_hashes(request, self.block_size, self.max_blocks)
        entry = Entry(hashes, endpoints)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(self.window, self._seal, batch)
        if self.max_batch != UNLIMITED and len(batch.entries) >= self.max_batch:
            self.rejected += 1
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {self.max_batch} reached")
        batch.entries.append(entry)
        self.requests += 1
        await batch.sealed.wait()  # cancelled (its producer timeout spent): no affinity is written

        total = len(hashes)
        zero = PrefixMatchInfo(0, total, self.block_size)
        values: dict[Any, PrefixMatchInfo] = dict.fromkeys(endpoints, zero)
        assigned = entry.assigned
        if assigned is not None:
            for ep in endpoints:  # by name: the endpoint objects may differ between requests
                if ep.metadata.name == assigned:
                    values[ep] = PrefixMatchInfo(total, total, self.block_size)
                    self.steered += 1
                    break
            # else: the assigned replica left between batching and release; zero everywhere
        state.set_attributes(PREFIX_MATCH, values)

    def _seal(self, batch: _Batch) -> None:
        """Close the window: later requests open a new one; place this one; release its requests."""
        if batch.closed:
            return
        batch.closed = True
        if self._batch is batch:
            self._batch = None
        self.windows += 1
        try:
            assign(batch.entries, self.k, self.min_colocate, self.by_tokens)
        finally:  # never leave the window's requests waiting, even if placement failed
            batch.sealed.set()
