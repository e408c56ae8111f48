"""``slo-headroom-tier-filter``: keep the endpoints predicted to meet the request's SLOs (GIE §4.6)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest


class SloHeadroomTierParams(PluginParams):
    """GIE's name and default."""

    epsilon_explore_neg: float = 0.01


class SloHeadroomTierFilter(PluginBase):
    """Split candidates into tiers by predicted headroom.  Type ``slo-headroom-tier-filter``.

    Positive tier: a valid prediction with TTFT and TPOT headroom both ≥ 0 (an invalid
    dimension does not count against it); everything else, endpoints without a prediction
    included, is the negative tier.  No valid prediction on any endpoint: keep all.  Both
    tiers non-empty: the negative tier with probability ``epsilonExploreNeg`` (exploration,
    so the model keeps learning about loaded endpoints), else the positive tier.
    Otherwise the non-empty tier.  Order is preserved.
    Consumes ``LATENCY_PREDICTION``.  Parameters: ``epsilonExploreNeg`` (0.01, in [0, 1]).
    ``rng`` is a plain attribute so tests can inject a seeded ``random.Random``.
    """

    TYPE: ClassVar[str] = "slo-headroom-tier-filter"
    PARAMS: ClassVar[type[PluginParams]] = SloHeadroomTierParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({LATENCY_PREDICTION})

    def __init__(self, name: str, params: SloHeadroomTierParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        eps = params.epsilon_explore_neg
        if not 0.0 <= eps <= 1.0:
            raise ConfigError(f"invalid config: epsilonExploreNeg must be in [0, 1], got {eps:f}")
        self.epsilon = eps
        self.rng = random.Random()

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        infos = state.attributes(LATENCY_PREDICTION)
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        any_prediction = False
        for ep in endpoints:
            info = infos.get(ep)
            if info is None or not (info.ttft_valid or info.tpot_valid):
                negative.append(ep)
                continue
            any_prediction = True
            ok = (not info.ttft_valid or info.ttft_headroom >= 0) and (
                not info.tpot_valid or info.tpot_headroom >= 0
            )
            (positive if ok else negative).append(ep)
        if not any_prediction:
            return endpoints
        if positive and negative:
            return negative if self.rng.random() < self.epsilon else positive
        return positive or negative
