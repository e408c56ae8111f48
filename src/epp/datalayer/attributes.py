"""Per-request endpoint attributes shared between producers and consumers (typed keys)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState


@dataclass(frozen=True, slots=True)
class PrefixMatchInfo:
    """How many of the request's prefix blocks an endpoint is believed to hold."""

    match_blocks: int
    total_blocks: int
    block_size_tokens: int


@dataclass(frozen=True, slots=True)
class InFlightLoad:
    """Requests and estimated tokens the EPP has sent to an endpoint and not seen finish."""

    requests: int
    tokens: int


@dataclass(frozen=True, slots=True)
class LatencyPredictionInfo:
    """Predicted latencies (ms) and headroom against the request's SLO."""

    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float
    tpot_headroom: float
    ttft: float
    tpot: float
    dispatched_request_count: int


PREFIX_MATCH: Final = AttributeKey(
    "PrefixCacheMatchInfoKey", PrefixMatchInfo, default_producer="approx-prefix-cache-producer"
)
# What the engines' KV events say each endpoint holds (the precise-prefix-cache-scorer), when
# one is configured: no default producer, so consumers read it only where it was written.
PRECISE_PREFIX_MATCH: Final = AttributeKey("PrecisePrefixCacheMatchInfoKey", PrefixMatchInfo)


def prefix_matches(state: CycleState) -> Mapping[Hashable, PrefixMatchInfo]:
    """What each endpoint holds of the prompt, for plugins that weigh cached against uncached
    tokens: the engines' reported blocks where a precise-prefix-cache-scorer wrote them (it
    falls back to the approximate index per endpoint itself), else the approximate index's
    guess.  Such a plugin CONSUMES ``PREFIX_MATCH`` and READS ``PRECISE_PREFIX_MATCH``."""
    return state.attributes(PRECISE_PREFIX_MATCH) or state.attributes(PREFIX_MATCH)


INFLIGHT_LOAD: Final = AttributeKey(
    "InFlightLoadKey", InFlightLoad, default_producer="inflight-load-producer"
)
LATENCY_PREDICTION: Final = AttributeKey(
    "LatencyPredictionInfoKey", LatencyPredictionInfo, default_producer="predicted-latency-producer"
)
