"""A scheduler twin whose profile runs open ``run_scheduler_profile`` spans, for sampled requests.

Built once from the pipeline's scheduler (same handler, same profiles, wrapped), so tracing
needs no hook inside the scheduling package and untraced requests run the plain scheduler.
The parent span comes from ``epp.tracing.stages.CURRENT``, which the stage observer
(observer.py) sets around the call; a profile run outside it records nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.api import Endpoint
from epp.director.pipeline import SchedulerLike
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.tracing import spans
from epp.tracing.stages import CURRENT, stage


class TracedProfile(SchedulerProfile):
    """``inner`` with a span per run: profile name, candidates in, endpoints picked (or the error)."""

    __slots__ = ("_inner",)

    def __init__(self, inner: SchedulerProfile) -> None:  # no super().__init__: run() delegates
        self._inner = inner
        self.name = inner.name
        self.filters = inner.filters
        self.scorers = inner.scorers
        self.picker = inner.picker

    def __repr__(self) -> str:
        return f"<TracedProfile {self.name!r}>"

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> ProfileRunResult:
        with stage(CURRENT.get(), spans.STAGE_PROFILE) as span:
            if span is not None:
                span.set_attribute(spans.ATTR_PROFILE_NAME, self.name)
                span.set_attribute(spans.ATTR_CANDIDATES, len(endpoints))
            result = self._inner.run(state, request, endpoints)
            if span is not None:
                span.set_attribute(spans.ATTR_TARGETS, [ep.hostport for ep in result.target_endpoints])
            return result


def traced_scheduler(scheduler: SchedulerLike) -> SchedulerLike:
    """``scheduler`` with traced profiles; another ``SchedulerLike`` (a test double) is returned as is."""
    if not isinstance(scheduler, Scheduler):
        return scheduler
    return Scheduler(scheduler.handler, [TracedProfile(p) for p in scheduler.profiles.values()])
