"""``endpoint-health-scorer``: the health penalty, and where the health policy is configured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.health import HEALTH, HealthPolicy
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class EndpointHealthScorer(PluginBase):
    """0.0 for a penalised endpoint, 1.0 for the others.  Type ``endpoint-health-scorer``, Balance.

    A penalised (``degraded``) endpoint, one whose time to first token is an outlier against its
    peers', or one the ejection budget keeps, still serves when it is the best by more than this
    scorer's weight.  Its parameters are the process's health policy (``HealthPolicy``: Envoy's
    outlier-detection names, docs/health.md); it is adopted when the plugin starts, so a config
    that fails to load changes nothing.  Without this plugin the defaults apply and penalties
    have no effect on scores (ejections still do).
    """

    TYPE: ClassVar[str] = "endpoint-health-scorer"
    PARAMS: ClassVar[type[PluginParams]] = HealthPolicy
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: HealthPolicy, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.policy = params

    async def start(self) -> None:
        HEALTH.configure(self.policy)

    async def stop(self) -> None:
        pass

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return [ep.health.score() for ep in endpoints]

    def debug_state(self) -> dict[str, Any]:
        """Every endpoint's health in the pool, by name (``/debug/plugins/state``)."""
        import time

        now = time.monotonic()
        return {"endpoints": {h.name: h.debug_state(now) for h in HEALTH.members}}
