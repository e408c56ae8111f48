"""What a traced and recorded request leaves behind at each routing stage, on success and on each
kind of failure: the span per stage (name, attributes, status) and the decision record (admission,
stage timings).  The spans come from the OTel SDK's in-memory exporter; the director is real."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import epp.director.director as director_module
from epp.datalayer.api import Endpoint
from epp.director.director import Director
from epp.director.lifecycle import RequestLifecycle
from epp.director.observer import NOT_OBSERVED, ActiveObserver, StageObserver
from epp.errors import EppError, ResourceExhausted
from epp.explain.record import Decision, DecisionRing
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult
from epp.tracing import spans
from epp.tracing.stages import StageSpans
from tests.director.test_director import Hooks, LowestQueue, Producer, body, director


class Refuse:
    """Admission that says no (as flow control does when the pool is saturated)."""

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        raise ResourceExhausted("system saturated", reason="rejected-saturated")

    def notify(self) -> None:
        return None

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        raise AssertionError("placed() is for requests admission let through")


class FailingPreRequest(Hooks):
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        raise RuntimeError("hook broke")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def observed(d: Director, exporter: InMemorySpanExporter, request_id: str) -> RequestLifecycle:
    """A request that is both sampled (stage spans) and recorded (the director's ring)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lc = d.start({"x-request-id": request_id}, {})
    lc.ctx.stages = StageSpans(provider.get_tracer("test"), Context())
    return lc


def recording(d: Director) -> DecisionRing:
    ring = DecisionRing(8)
    d.swap(replace(d.pipeline, decisions=ring))
    return ring


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def record(ring: DecisionRing, request_id: str) -> Decision:
    rec = ring.get(request_id)
    assert rec is not None
    return rec


async def rejected(
    d: Director, exporter: InMemorySpanExporter, error: type[BaseException], match: str = ""
) -> tuple[dict[str, ReadableSpan], Decision, RequestLifecycle]:
    """Route one observed request that fails with ``error``: its spans by name, its record, its lifecycle."""
    ring = recording(d)
    lc = observed(d, exporter, "failing")
    with pytest.raises(error, match=match or None):
        await lc.route(body())
    lc.close()
    return by_name(exporter), record(ring, "failing"), lc


async def test_every_stage_has_a_span_and_a_timing(exporter: InMemorySpanExporter) -> None:
    d, _ = director(producers=(Producer("p1"),), hooks=Hooks())
    ring = recording(d)
    lc = observed(d, exporter, "ok")
    decision = await lc.route(body())
    lc.close()
    found = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert [s.name for s in found] == [
        spans.STAGE_PARSE,
        spans.STAGE_ADMISSION,
        spans.STAGE_PRODUCERS,
        spans.STAGE_ADMIT_PLUGINS,
        spans.STAGE_SCHEDULE,
        spans.STAGE_PICK,
    ]
    assert all(s.status.status_code is StatusCode.UNSET for s in found)
    stage = {s.name: dict(s.attributes or {}) for s in found}
    assert stage[spans.STAGE_PRODUCERS] == {spans.ATTR_PRODUCERS: ("p1/producer",), spans.ATTR_CANDIDATES: 3}
    assert stage[spans.STAGE_ADMIT_PLUGINS] == {
        spans.ATTR_PLUGINS: ("hooks/hooks",),
        spans.ATTR_OUTCOME: "admitted",
    }
    # A scheduler that is not the project's Scheduler is run as is: no profile spans, same attributes.
    assert stage[spans.STAGE_SCHEDULE] == {
        spans.ATTR_CANDIDATES: 3,
        spans.ATTR_PRIMARY_PROFILE: "default",
        spans.ATTR_PROFILE_RESULTS: ("default=192.168.1.2:8000",),
    }
    assert stage[spans.STAGE_PICK] == {
        spans.ATTR_DESTINATION: "192.168.1.2:8000",
        spans.ATTR_PRIMARY_PROFILE: "default",
        spans.ATTR_TARGETS: ("192.168.1.2:8000",),
    }
    rec = record(ring, "ok")
    assert list(rec.stages) == [
        "body",
        "parse",
        "admission",
        "producers",
        "admit-plugins",
        "schedule",
        "pick",
    ]
    assert all(ns >= 0 for ns in rec.stages.values())
    assert (rec.admission, rec.outcome, rec.destination) == ("admitted", "routed", decision.destination)
    assert len(rec.candidates) == 3


async def test_admission_refusal_fails_its_span_and_is_recorded(exporter: InMemorySpanExporter) -> None:
    found, rec, _ = await rejected(director(admission=Refuse())[0], exporter, ResourceExhausted)
    assert set(found) == {spans.STAGE_PARSE, spans.STAGE_ADMISSION}
    admission = found[spans.STAGE_ADMISSION]
    assert admission.status.status_code is StatusCode.ERROR
    assert (
        admission.status.description
        == "ResourceExhausted: inference error: ResourceExhausted - system saturated"
    )
    assert [e.name for e in admission.events] == ["exception"]
    assert (rec.admission, rec.outcome, rec.reason) == ("rejected", "rejected", "rejected-saturated")
    assert list(rec.stages) == ["body", "parse"]


async def test_admit_plugin_denial_names_the_plugin(exporter: InMemorySpanExporter) -> None:
    found, rec, _ = await rejected(director(hooks=Hooks(deny="too big"))[0], exporter, EppError)
    assert spans.STAGE_SCHEDULE not in found
    denied = found[spans.STAGE_ADMIT_PLUGINS]
    assert denied.status.status_code is StatusCode.ERROR
    assert dict(denied.attributes or {}) == {
        spans.ATTR_PLUGINS: ("hooks/hooks",),
        spans.ATTR_OUTCOME: "denied by hooks/hooks: too big",
    }
    assert (rec.admission, rec.reason) == ("rejected", "rejected-admission")
    assert list(rec.stages) == ["body", "parse", "admission"]


async def test_scheduler_failure_records_the_schedulers_own_error(exporter: InMemorySpanExporter) -> None:
    d, _ = director(scheduler=LowestQueue(fail=ValueError("no profile fits")))
    found, rec, _ = await rejected(d, exporter, ResourceExhausted, "no profile fits")
    schedule = found[spans.STAGE_SCHEDULE]
    assert schedule.status.status_code is StatusCode.ERROR
    assert schedule.status.description == "ValueError: no profile fits"  # not the 429 it becomes
    assert spans.STAGE_PICK not in found
    assert (rec.admission, rec.reason) == ("admitted", "rejected-no-candidates")
    assert list(rec.stages) == ["body", "parse", "admission"]


async def test_pre_request_failure_fails_the_pick_span(exporter: InMemorySpanExporter) -> None:
    found, rec, lc = await rejected(
        director(hooks=FailingPreRequest())[0], exporter, RuntimeError, "hook broke"
    )
    assert lc.scheduled  # the completion hooks still release what pre-request took
    pick = found[spans.STAGE_PICK]
    assert pick.status.status_code is StatusCode.ERROR
    assert pick.status.description == "RuntimeError: hook broke"
    assert (rec.admission, rec.reason, rec.destination) == ("admitted", "rejected-internal", "")
    assert list(rec.stages) == ["body", "parse", "admission", "admit-plugins", "schedule"]


async def test_a_failure_between_stages_fails_no_span(exporter: InMemorySpanExporter) -> None:
    """No candidates after admission: the admission span ended well and no later one started."""
    found, rec, _ = await rejected(director(eps=[])[0], exporter, EppError)
    assert set(found) == {spans.STAGE_PARSE, spans.STAGE_ADMISSION}
    assert all(s.status.status_code is StatusCode.UNSET for s in found.values())
    assert rec.reason == "rejected-no-endpoints"


async def test_an_unobserved_request_gets_no_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither sampled nor recorded: no observer is made, and routing is the same."""
    d, _ = director(producers=(Producer("p1"),), hooks=Hooks())
    plain = await d.start({}, {}).route(body())

    def made(*args: object) -> ActiveObserver:
        raise AssertionError("an observer was made")

    # the module's name, not a method: the director may be compiled (mypyc binds its own methods)
    monkeypatch.setattr(director_module, "ActiveObserver", made)
    assert (await d.start({}, {}).route(body())).destination == plain.destination
    recording(d)
    with pytest.raises(AssertionError, match="an observer was made"):  # the check does tell them apart
        await d.start({}, {}).route(body())


async def test_an_unobserved_request_makes_no_observer_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage present (producers, admit plugins): still not one call on the shared no-op."""

    def called(*args: object) -> None:
        raise AssertionError("the no-op observer was called")

    for name in ("begin", "parsed", "admitted", "saw", "produced", "admitting", "plugins_admitted"):
        monkeypatch.setattr(StageObserver, name, called)
    for name in ("schedule", "scheduled", "picked", "failed", "denied"):
        monkeypatch.setattr(StageObserver, name, called)
    d, _ = director(producers=(Producer("p1"),), hooks=Hooks())
    assert (await d.start({}, {}).route(body())).destination == "192.168.1.2:8000"
    denied, _ = director(hooks=Hooks(deny="no"))
    with pytest.raises(EppError, match="cannot be admitted"):
        await denied.start({}, {}).route(body())


def test_the_no_op_observer_may_be_called_unchecked() -> None:
    """``active`` is a shortcut: every call on the shared no-op does nothing."""
    assert not NOT_OBSERVED.active and ActiveObserver.active
    hooks = Hooks()
    NOT_OBSERVED.begin(spans.STAGE_PARSE)
    NOT_OBSERVED.admitting((hooks,))  # type: ignore[arg-type]
    NOT_OBSERVED.denied(hooks, "no")  # type: ignore[arg-type]
    NOT_OBSERVED.plugins_admitted()
    NOT_OBSERVED.scheduled()
    NOT_OBSERVED.failed(RuntimeError("x"))
    with pytest.raises(NotImplementedError):  # the director schedules an unobserved request itself
        NOT_OBSERVED.schedule(CycleState(), InferenceRequest(request_id="r", headers={}), ())
