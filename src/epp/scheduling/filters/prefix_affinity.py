"""``prefix-cache-affinity-filter``: keep only "sticky" endpoints that already hold most of the prompt."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION, PREFIX_MATCH, LatencyPredictionInfo
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

_NO_TTFT: Final = sys.float_info.max  # Go's math.MaxFloat64 when no endpoint has a prediction


class PrefixCacheAffinityParams(PluginParams):
    """Thresholds of the affinity gate (GIE names and defaults)."""

    affinity_threshold: float = 0.80
    exploration_probability: float = 0.01
    max_ttft_penalty_ms: float = Field(5000.0, alias="maxTTFTPenaltyMs")  # not to_camel's maxTtft...


class PrefixCacheAffinityFilter(PluginBase):
    """Narrow the candidates to sticky endpoints.  Type ``prefix-cache-affinity-filter``.

    An endpoint is sticky when its prefix score (``match_blocks / total_blocks``) is at
    least ``affinityThreshold``.  In order: with one endpoint or a threshold ``<= 0``, keep
    all; with probability ``explorationProbability``, keep all; with no sticky endpoint,
    keep all; if the best predicted TTFT among sticky endpoints exceeds the best among the
    others by more than ``maxTTFTPenaltyMs`` (0 disables the check), keep all; otherwise
    keep only the sticky ones.  An endpoint without a latency prediction counts as
    ``float max`` TTFT, exactly as in GIE.
    Consumes: ``PREFIX_MATCH``; reads ``LATENCY_PREDICTION`` when some producer wrote it
    (not declared, so it does not auto-create the predicted-latency producer).
    Parameters: ``affinityThreshold`` (0.80, ``<= 1``), ``explorationProbability``
    (0.01, in [0, 1]), ``maxTTFTPenaltyMs`` (5000, ``>= 0``).
    ``rng`` is a plain attribute so tests can inject a seeded ``random.Random``.
    """

    TYPE: ClassVar[str] = "prefix-cache-affinity-filter"
    PARAMS: ClassVar[type[PluginParams]] = PrefixCacheAffinityParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})

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
        self.rng = random.Random()

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        tau = self.affinity_threshold
        if len(endpoints) <= 1 or tau <= 0:
            return endpoints
        if self.rng.random() < self.exploration_probability:
            return endpoints
        infos = state.attributes(PREFIX_MATCH)
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
            predictions = state.attributes(LATENCY_PREDICTION)
            if _best_ttft(predictions, sticky) - _best_ttft(predictions, others) > self.max_ttft_penalty_ms:
                return endpoints
        return sticky


def _best_ttft(predictions: Any, endpoints: list[Endpoint]) -> float:
    best = _NO_TTFT
    for ep in endpoints:
        p: LatencyPredictionInfo | None = predictions.get(ep)
        if p is not None and p.ttft < best:
            best = p.ttft
    return best
