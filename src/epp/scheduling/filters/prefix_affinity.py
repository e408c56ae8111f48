"""``prefix-cache-affinity-filter``: keep only "sticky" endpoints that already hold most of the prompt."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import (
    INFLIGHT_LOAD,
    LATENCY_PREDICTION,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    LatencyPredictionInfo,
    prefix_matches,
)
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

_NO_TTFT: Final = sys.float_info.max  # Go's math.MaxFloat64 when no endpoint has a prediction
DEFAULT_PEAK_PREFILL_THROUGHPUT: Final = 15928.0  # llm-d's default (tokens/s, Qwen 32B)


class PrefixCacheAffinityParams(PluginParams):
    """Thresholds of the affinity gate (GIE names and defaults)."""

    affinity_threshold: float = 0.80
    exploration_probability: float = 0.01
    max_ttft_penalty_ms: float = Field(5000.0, alias="maxTTFTPenaltyMs")  # not to_camel's maxTtft...
    # llm-d-router's TTFT source: "latencyPredictor" (GIE's only one) or "prefillThroughput"
    # (in-flight tokens / peakPrefillThroughput).  Unset: prefillThroughput when
    # peakPrefillThroughput is given (llm-d configs), else latencyPredictor (GIE configs).
    ttft_source: Literal["", "latencyPredictor", "prefillThroughput"] = Field("", alias="ttftSource")
    peak_prefill_throughput: float = Field(DEFAULT_PEAK_PREFILL_THROUGHPUT, ge=0)


class PrefixCacheAffinityFilter(PluginBase):
    """Narrow the candidates to sticky endpoints.  Type ``prefix-cache-affinity-filter``.

    An endpoint is sticky when its prefix score (``match_blocks / total_blocks``) is at
    least ``affinityThreshold``.  In order: with one endpoint or a threshold ``<= 0``, keep
    all; with probability ``explorationProbability``, keep all; with no sticky endpoint,
    keep all; if the best predicted TTFT among sticky endpoints exceeds the best among the
    others by more than ``maxTTFTPenaltyMs`` (0 disables the check), keep all; otherwise
    keep only the sticky ones.  An endpoint without a latency prediction counts as
    ``float max`` TTFT, exactly as in GIE.
    The score is what the engine reported holding where a precise-prefix-cache-scorer runs
    (``PRECISE_PREFIX_MATCH``, read), else the approximate index's guess.
    Consumes: ``PREFIX_MATCH``; reads ``LATENCY_PREDICTION`` when some producer wrote it
    (not declared, so it does not auto-create the predicted-latency producer).
    Parameters: ``affinityThreshold`` (0.80, ``<= 1``), ``explorationProbability``
    (0.01, in [0, 1]), ``maxTTFTPenaltyMs`` (5000, ``>= 0``); llm-d-router's ``ttftSource``
    (``latencyPredictor`` | ``prefillThroughput``) and ``peakPrefillThroughput`` (15928 tokens/s):
    with ``prefillThroughput`` (the default once ``peakPrefillThroughput`` is given) an endpoint's
    TTFT is its in-flight tokens / ``peakPrefillThroughput`` in ms, 0 without a recorded load.
    ``rng`` is a plain attribute so tests can inject a seeded ``random.Random``.
    """

    TYPE: ClassVar[str] = "prefix-cache-affinity-filter"
    PARAMS: ClassVar[type[PluginParams]] = PrefixCacheAffinityParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})

    def __init__(self, name: str, params: PrefixCacheAffinityParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        tau, p, penalty = (
            params.affinity_threshold,
            params.exploration_probability,
            params.max_ttft_penalty_ms,
        )
        if tau > 1.0:
            raise ConfigError(f"invalid config: affinityThreshold must be <= 1.0, got {tau:f}")
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"invalid config: explorationProbability must be in [0, 1], got {p:f}")
        if penalty < 0:
            raise ConfigError(f"invalid config: maxTTFTPenaltyMs must be >= 0, got {penalty:f}")
        self.affinity_threshold = params.affinity_threshold
        self.exploration_probability = params.exploration_probability
        self.max_ttft_penalty_ms = params.max_ttft_penalty_ms
        source = params.ttft_source
        if not source:
            explicit = "peak_prefill_throughput" in params.model_fields_set
            source = "prefillThroughput" if explicit else "latencyPredictor"
        self.peak_prefill_throughput = params.peak_prefill_throughput
        self.throughput_ttft = source == "prefillThroughput"
        if self.throughput_ttft and penalty > 0:
            if self.peak_prefill_throughput <= 0:
                raise ConfigError("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput")
            # the gate reads in-flight tokens: ask for the producer (instance-level CONSUMES)
            self.__dict__["CONSUMES"] = frozenset({PREFIX_MATCH, INFLIGHT_LOAD})
        self.rng = random.Random()

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        tau = self.affinity_threshold
        if len(endpoints) <= 1 or tau <= 0:
            return endpoints
        if self.rng.random() < self.exploration_probability:
            return endpoints
        infos = prefix_matches(state)
        sticky: list[Endpoint] = []
        others: list[Endpoint] = []
        for ep in endpoints:
            info = infos.get(ep)
            score = 0.0
            if info is not None and info.total_blocks > 0:
                score = info.match_blocks / info.total_blocks
            (sticky if score >= tau else others).append(ep)
        if not sticky:
            return endpoints
        if self.max_ttft_penalty_ms > 0 and others:
            if self.throughput_ttft:
                loads = state.attributes(INFLIGHT_LOAD)
                if self._throughput_ttft(loads, sticky) - self._throughput_ttft(loads, others) > (
                    self.max_ttft_penalty_ms
                ):
                    return endpoints
                return sticky
            predictions = state.attributes(LATENCY_PREDICTION)
            if _best_ttft(predictions, sticky) - _best_ttft(predictions, others) > self.max_ttft_penalty_ms:
                return endpoints
        return sticky

    def _throughput_ttft(self, loads: Any, endpoints: list[Endpoint]) -> float:
        """llm-d's estimate: the lowest in-flight tokens / peak prefill throughput, in ms."""
        tokens = min((0 if (load := loads.get(ep)) is None else load.tokens) for ep in endpoints)
        return tokens / self.peak_prefill_throughput * 1000.0


def _best_ttft(predictions: Any, endpoints: list[Endpoint]) -> float:
    best = _NO_TTFT
    for ep in endpoints:
        p: LatencyPredictionInfo | None = predictions.get(ep)
        if p is not None and p.ttft < best:
            best = p.ttft
    return best
