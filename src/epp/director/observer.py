"""What is written down about a request's routing: a span per stage and the decision record.

Routing (director.py) says what happens; this module says what is noted about it.  Two
independent watchers exist: OpenTelemetry stage spans for a sampled request (``ctx.stages``,
set by the edge) and the decision record with its stage timings for ``--decisions-buffer-size``
(``ctx.record``, made by ``Director.start``).  Most requests have neither and share
``NOT_OBSERVED``, a no-op whose ``active`` is False: the director reads that flag once into a local
and tests it before each call, so an unobserved request allocates nothing here and makes no
call per stage.

A stage opens with ``begin`` and closes with its own method (``parsed``, ``admitted``, ...),
which knows that stage's span attributes and record mark; ``failed`` closes whichever stage is
open when routing raises (and notes a refusal by admission).  Span names and attributes are
GIE's and llm-d-router's where they have one (``epp.tracing.spans``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from opentelemetry.trace import Span

from epp.datalayer.api import Endpoint
from epp.director.api import Admitter, DataProducer
from epp.director.context import RequestContext
from epp.director.pipeline import SchedulerLike
from epp.errors import EppError
from epp.explain.record import REJECTED, ROUTED, Decision, DecisionRing
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import PROFILE_TRACES, DisaggDecision, ProfileRunResult, SchedulingResult
from epp.tracing import spans
from epp.tracing.stages import CURRENT, StageSpans, fail

# The stages a failure of which means admission said no (the record's ``admission`` field).
_ADMISSION_STAGES: Final = frozenset({spans.STAGE_ADMISSION, spans.STAGE_ADMIT_PLUGINS})


class StageObserver:
    """The observer interface, and the no-op that every unobserved request shares.

    ``active`` False tells the director it may skip the calls; they are no-ops all the same, so a
    caller that does not check is slower, never wrong.
    """

    __slots__ = ()
    active: ClassVar[bool] = False

    def begin(self, stage: str) -> None:
        """``stage`` (a ``spans.STAGE_*`` name) starts now."""

    def parsed(self, request: InferenceRequest, body_bytes: int, rewrite: str) -> None:
        """Parse, model rewrite and priority are done."""

    def admitted(self, candidates: Sequence[Endpoint]) -> None:
        """Admission (flow control) let the request through."""

    def saw(self, candidates: Sequence[Endpoint]) -> None:
        """The candidates routing goes on with (fresh and available, after admission)."""

    def produced(self, producers: Sequence[DataProducer], candidates: Sequence[Endpoint]) -> None:
        """The data producers ran (each failure was logged; the request goes on)."""

    def admitting(self, admitters: Sequence[Admitter]) -> None:
        """The admit plugins start."""

    def denied(self, admitter: Admitter, reason: str) -> None:
        """``admitter`` refused the request; the refusal is raised next."""

    def plugins_admitted(self) -> None:
        """Every admit plugin let the request through."""

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        """Not called while ``active`` is False: the director runs its plain scheduler itself."""
        raise NotImplementedError("an unobserved request is scheduled by the director")

    def scheduled(self) -> None:
        """The scheduler's verdict has a primary target."""

    def picked(self, result: SchedulingResult, targets: Sequence[Endpoint], destination: str) -> None:
        """Pre-request hooks ran and the body is ready: the request goes to ``destination``."""

    def failed(self, exc: BaseException) -> None:
        """Routing raised ``exc``; the open stage (if any) failed with it."""


NOT_OBSERVED: Final = StageObserver()


class ActiveObserver(StageObserver):
    """One request's stage spans (sampled requests) and/or decision record, whichever it has."""

    __slots__ = ("_open", "_scheduler", "_stage", "record", "stages")
    active: ClassVar[bool] = True

    def __init__(self, stages: StageSpans | None, record: Decision | None, scheduler: SchedulerLike) -> None:
        """``scheduler``: the one to run, its traced twin (director/traced.py) when ``stages`` is set."""
        self.stages = stages
        self.record = record
        self._scheduler = scheduler
        self._open: Span | None = None  # the span of the stage that is running
        self._stage = ""  # the name of that stage (also when not traced)
        if record is not None:
            record.mark("body")  # from the request headers to the end of the body

    def begin(self, stage: str) -> None:
        self._stage = stage
        if self.stages is not None:
            self._open = self.stages.start(stage)

    # Each stage's method closes the stage inline (``span, self._open, self._stage = ...``) and
    # marks the record itself: a helper call per step would double a recorded request's calls.

    def parsed(self, request: InferenceRequest, body_bytes: int, rewrite: str) -> None:
        span, self._open, self._stage = self._open, None, ""
        if span is not None:
            span.set_attributes(
                {
                    spans.ATTR_BODY_BYTES: body_bytes,
                    spans.ATTR_MODEL: request.incoming_model,
                    spans.ATTR_TARGET: request.target_model,
                    spans.ATTR_MODEL_REWRITE: rewrite,
                    spans.ATTR_OBJECTIVE: request.objective,
                    spans.ATTR_PRIORITY: request.priority,
                }
            )
            span.end()
        if self.record is not None:
            self.record.mark("parse")

    def admitted(self, candidates: Sequence[Endpoint]) -> None:
        span, self._open, self._stage = self._open, None, ""
        if span is not None:
            span.set_attributes({spans.ATTR_CANDIDATES: len(candidates), spans.ATTR_OUTCOME: "admitted"})
            span.end()
        if self.record is not None:
            self.record.mark("admission")

    def saw(self, candidates: Sequence[Endpoint]) -> None:
        if self.record is not None:
            self.record.candidates = candidates

    def produced(self, producers: Sequence[DataProducer], candidates: Sequence[Endpoint]) -> None:
        span, self._open, self._stage = self._open, None, ""
        if span is not None:
            span.set_attributes(
                {
                    spans.ATTR_PRODUCERS: [str(x.typed_name) for x in producers],
                    spans.ATTR_CANDIDATES: len(candidates),
                }
            )
            span.end()
        if self.record is not None:
            self.record.mark("producers")

    def admitting(self, admitters: Sequence[Admitter]) -> None:
        self._stage = spans.STAGE_ADMIT_PLUGINS
        if self.stages is not None:
            span = self._open = self.stages.start(spans.STAGE_ADMIT_PLUGINS)
            span.set_attribute(spans.ATTR_PLUGINS, [str(a.typed_name) for a in admitters])

    def denied(self, admitter: Admitter, reason: str) -> None:
        if self._open is not None:
            self._open.set_attribute(spans.ATTR_OUTCOME, f"denied by {admitter.typed_name}: {reason}")

    def plugins_admitted(self) -> None:
        span, self._open, self._stage = self._open, None, ""
        if span is not None:
            span.set_attribute(spans.ATTR_OUTCOME, "admitted")
            span.end()
        if self.record is not None:
            self.record.mark("admit-plugins")

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        """The scheduler's verdict; when traced, inside ``epp.schedule`` with a span per profile.

        Reaching the scheduler means admission passed.  A failure is recorded on the span as
        the scheduler raised it (the director turns it into a 429 afterwards).
        """
        if self.record is not None:
            self.record.admission = "admitted"
        stages = self.stages
        if stages is None:
            return self._scheduler.schedule(state, request, candidates)
        self._stage = spans.STAGE_SCHEDULE
        span = self._open = stages.start(spans.STAGE_SCHEDULE)
        span.set_attribute(spans.ATTR_CANDIDATES, len(candidates))
        token = CURRENT.set(stages.under(span))  # profile runs hang their spans from this one
        try:
            result = self._scheduler.schedule(state, request, candidates)
        except BaseException as e:
            self.failed(e)
            raise
        finally:
            CURRENT.reset(token)
        self._open, self._stage = None, ""
        span.set_attribute(spans.ATTR_PRIMARY_PROFILE, result.primary_profile_name)
        span.set_attribute(
            spans.ATTR_PROFILE_RESULTS,
            [f"{name}={_picked(r)}" for name, r in result.profile_results.items()],
        )
        span.end()
        return result

    def scheduled(self) -> None:
        if self.record is not None:
            self.record.mark("schedule")

    def picked(self, result: SchedulingResult, targets: Sequence[Endpoint], destination: str) -> None:
        span, self._open, self._stage = self._open, None, ""
        if span is not None:
            span.set_attributes(
                {
                    spans.ATTR_DESTINATION: destination,
                    spans.ATTR_PRIMARY_PROFILE: result.primary_profile_name,
                    spans.ATTR_TARGETS: [t.hostport for t in targets],
                }
            )
            if result.disagg is not None:
                span.set_attributes(_disagg_attributes(result.disagg))
            span.end()
        record = self.record
        if record is not None:
            record.mark("pick")
            record.destination = destination

    def failed(self, exc: BaseException) -> None:
        span, stage = self._open, self._stage
        self._open, self._stage = None, ""
        fail(span, exc)
        if self.record is not None and stage in _ADMISSION_STAGES:
            self.record.admission = "rejected"


def commit(ring: DecisionRing, ctx: RequestContext, error: BaseException | None) -> None:
    """Put the request's decision record into ``ring`` with what routing decided and how it ended."""
    record = ctx.record
    if record is None:
        return
    ctx.record = None  # once per request
    request = ctx.request
    record.model = request.incoming_model
    record.target_model = request.target_model
    traces = ctx.state.get(PROFILE_TRACES)
    if traces:
        record.profiles = tuple(traces)
    if ctx.result is not None:
        record.primary_profile = ctx.result.primary_profile_name
        record.disagg = ctx.result.disagg
    if error is None:
        record.outcome = ROUTED
    else:
        record.outcome = REJECTED
        if isinstance(error, EppError):
            record.reason = error.reason
        else:  # the client went away (the stream was cancelled), or a crash
            record.reason = "cancelled" if isinstance(error, asyncio.CancelledError) else "rejected-internal"
        record.error = str(error)
    ring.add(record)


def _disagg_attributes(d: DisaggDecision) -> dict[str, Any]:
    """llm-d-router's span attributes for a P/D decision (sampled requests only)."""
    attrs: dict[str, Any] = {
        spans.ATTR_PD_USED: bool(d.prefill),
        spans.ATTR_PD_REASON: d.reason,
        spans.ATTR_PROFILE_HANDLER_DECISION: f"complete_{d.decision_type}",
    }
    if d.declined_profile:
        attrs[spans.ATTR_PD_DECLINED_PROFILE] = d.declined_profile
    if d.prefill:
        host, _, port = d.prefill.rpartition(":")
        attrs[spans.ATTR_PD_PREFILL_ADDRESS] = host.strip("[]")
        attrs[spans.ATTR_PD_PREFILL_PORT] = port
    return attrs


def _picked(result: ProfileRunResult | None) -> str:
    return ",".join(t.hostport for t in result.target_endpoints) if result is not None else "failed"
