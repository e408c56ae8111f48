"""``p2p-source-producer`` (llm-d-router): name a peer that holds the prompt's KV blocks, so the
routing sidecar can pull them over vLLM's P2P connector instead of recomputing them.

A request-control plugin: a data producer (the source peer, before scheduling) and a
pre-request hook (the routing-sidecar header, once the computing pod is known).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import HeaderMutation, InferenceRequest
from epp.scheduling.api import SchedulingResult

KV_CACHE_SOURCE_HEADER: Final = "x-kv-cache-source-host-port"
DEFAULT_PREFILL_PROFILE: Final = "prefill"
_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193


@dataclass(frozen=True, slots=True)
class BestMatchPeer:
    """The chosen source peer and the prompt tokens it holds."""

    hostport: str
    cached_tokens: int


class P2PSourceProducerParams(PluginParams):
    prefix_match_info_producer_name: str = ""
    min_cached_token_delta: int = Field(default=1, ge=1)  # upstream: "must be >= 1"
    prefill_profile_name: str = ""  # "": prefill


def spread_fraction(request_id: str) -> float:
    """FNV-1a 32 of the request id over 2**32: upstream's sampling coordinate in [0, 1)."""
    h = _FNV32_OFFSET
    for byte in request_id.encode():
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h / 4294967296.0


class P2PSourceProducer(PluginBase):
    """Sets ``x-kv-cache-source-host-port`` to a peer within one block of the most cached prompt
    prefix.  Type ``p2p-source-producer``.

    Before scheduling: among the candidates whose ``PrefixMatchInfo`` holds cached blocks, those
    within one block of the most cached tokens (``match_blocks * block_size_tokens``) form a
    band; one is sampled with weight ``1 / (1 + waiting queue)`` at the request id's FNV-1a
    fraction (a deterministic spread: pulls do not all go to one replica of a widely cached
    prefix).  After scheduling: the computing pod is the ``prefillProfileName`` profile's target
    (``prefill``) when it has one, else the primary profile's; the header is set only if the
    peer is another pod holding at least ``minCachedTokenDelta`` (1, ≥ 1) more cached tokens.
    A client's own header is always removed.  ``prefixMatchInfoProducerName`` is accepted: this
    EPP keeps one ``PREFIX_MATCH`` per request, written by whichever prefix producer is
    configured.  Upstream counts only CPU-tier blocks when its producer reports tiers; this
    EPP's match info has no tiers, so every matched block counts (upstream's fallback).
    """

    TYPE: ClassVar[str] = "p2p-source-producer"
    PARAMS: ClassVar[type[PluginParams]] = P2PSourceProducerParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, P2PSourceProducerParams)
        self.min_cached_token_delta = params.min_cached_token_delta
        self.prefill_profile = params.prefill_profile_name or DEFAULT_PREFILL_PROFILE
        self.best_key: StateKey[BestMatchPeer] = StateKey(f"best-match/{self.TYPE}/{name}")

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        self.prepare_request_data_now(state, request, endpoints)

    def prepare_request_data_now(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        """Never waits: the director calls this without a coroutine (director.api.ImmediateProducer)."""
        best = self.best_match(state.attributes(PREFIX_MATCH), request.request_id, endpoints)
        if best is not None:
            state.put(self.best_key, best)

    def best_match(
        self, infos: Mapping[Any, PrefixMatchInfo], request_id: str, endpoints: Sequence[Endpoint]
    ) -> BestMatchPeer | None:
        """Upstream's ``Produce``: the sampled peer of the one-block band, or None if none holds any."""
        matches: list[tuple[Endpoint, int, int]] = []
        most = 0
        for ep in endpoints:
            info = infos.get(ep)
            if info is None or info.match_blocks <= 0 or info.block_size_tokens <= 0:
                continue
            cached = info.match_blocks * info.block_size_tokens
            matches.append((ep, cached, info.block_size_tokens))
            most = max(most, cached)
        if not most:
            return None
        band = [(ep, cached) for ep, cached, block in matches if cached + block >= most]
        weights = [1.0 / (1.0 + ep.metrics.waiting_queue_size) for ep, _ in band]
        target = spread_fraction(request_id) * sum(weights)
        chosen = len(band) - 1
        for i, w in enumerate(weights):
            if target < w:
                chosen = i
                break
            target -= w
        ep, cached = band[chosen]
        return BestMatchPeer(ep.hostport, cached)

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        mutation = request.header_mutation
        if request.headers.pop(KV_CACHE_SOURCE_HEADER, None) is not None or mutation is not None:
            if mutation is None:
                mutation = request.header_mutation = HeaderMutation()
            mutation.set.pop(KV_CACHE_SOURCE_HEADER, None)
            if KV_CACHE_SOURCE_HEADER not in mutation.remove:
                mutation.remove.append(
                    KV_CACHE_SOURCE_HEADER
                )  # what the client sent never reaches the sidecar
        best = state.get(self.best_key)
        if best is None:
            return
        computing = result.profile_results.get(self.prefill_profile)
        if computing is None or not computing.target_endpoints:
            computing = result.profile_results.get(result.primary_profile_name)
        if computing is None or not computing.target_endpoints:
            return
        target = computing.target_endpoints[0]
        if best.hostport == target.hostport:
            return
        info = state.attributes(PREFIX_MATCH).get(target)
        computing_cached = 0 if info is None else info.match_blocks * info.block_size_tokens
        if best.cached_tokens - computing_cached < self.min_cached_token_delta:
            return
        if mutation is None:
            mutation = request.header_mutation = HeaderMutation()
        mutation.set[KV_CACHE_SOURCE_HEADER] = best.hostport
