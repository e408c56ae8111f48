"""One span per request and a child per routing stage, through a real ext_proc stream, with the
OTel SDK's in-memory exporter; the upstream request carries the trace context."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from epp.director.traced import traced_scheduler
from epp.plugin.state import CycleState
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.server.extproc import ExtProcServicer
from epp.server.transport import make_server
from epp.testing.plugins import build
from epp.tracing import spans
from epp.tracing.otel import OtelTracing, Tracing, setup_tracing
from epp.tracing.stages import CURRENT, StageSpans
from tests.config.fakes import MultiProfileHandler
from tests.scheduling.builders import endpoint, request
from tests.scheduling.test_scheduler import DropFilter
from tests.server.harness import Harness, llm_request, pods, req_body, req_headers, set_headers

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
STAGES = (
    spans.STAGE_PARSE,
    spans.STAGE_ADMISSION,
    spans.STAGE_PRODUCERS,
    spans.STAGE_SCHEDULE,
    spans.STAGE_PICK,
)


class Opts:
    tracing = True


class TracedHarness(Harness):
    def __init__(self, tracing: Tracing) -> None:
        super().__init__()
        self.tracing = tracing

    async def __aenter__(self) -> TracedHarness:
        for observer in self.components.observers:
            self.datastore.add_observer(observer)
        self.server = make_server(self.transport, ExtProcServicer(self.director, tracing=self.tracing), None)
        port = await self.server.start("127.0.0.1", 0, None)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        return self


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Iterator[OtelTracing]:
    t = setup_tracing(Opts(), {spans.ENV_SAMPLER_ARG: "0"}, exporter=exporter, install_global=False)
    assert isinstance(t, OtelTracing)
    yield t
    t.shutdown()


@pytest.fixture
async def harness(tracing: OtelTracing) -> AsyncIterator[TracedHarness]:
    async with TracedHarness(tracing) as h:
        h.set_pods(pods((0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2)))
        yield h


def traced(prompt: str, model: str, *, sampled: bool = True) -> list:  # type: ignore[type-arg]
    msgs = llm_request(prompt, model, model)
    flags = "01" if sampled else "00"
    headers = {h.key: h.value for h in msgs[0].request_headers.headers.headers}
    headers["traceparent"] = f"00-{TRACE_ID}-{PARENT_ID}-{flags}"
    return [req_headers(headers), msgs[1]]


def children(found: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in found if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_stage_spans_under_the_request_and_traceparent_upstream(
    harness: TracedHarness, exporter: InMemorySpanExporter
) -> None:
    replies = await harness.exchange(traced("test1", "my-model"))
    found = list(exporter.get_finished_spans())
    by_name = {s.name: s for s in found}
    request = by_name[spans.REQUEST_SPAN]
    assert request.context is not None and f"{request.context.trace_id:032x}" == TRACE_ID
    assert request.kind == SpanKind.SERVER
    (orchestration,) = children(found, request)
    assert orchestration.name == spans.ORCHESTRATION_SPAN
    stage_spans = children(found, orchestration)
    assert [s.name for s in sorted(stage_spans, key=lambda s: s.start_time or 0)] == list(STAGES)
    for s in stage_spans:
        assert s.kind == SpanKind.INTERNAL
        assert s.status.status_code != StatusCode.ERROR
        assert s.context is not None and s.context.trace_id == request.context.trace_id

    parse = dict(by_name[spans.STAGE_PARSE].attributes or {})
    assert parse[spans.ATTR_MODEL] == "my-model"
    assert parse[spans.ATTR_TARGET] == "my-model"
    assert parse[spans.ATTR_PRIORITY] == 2
    body_bytes = parse[spans.ATTR_BODY_BYTES]
    assert isinstance(body_bytes, int) and body_bytes > 0
    assert dict(by_name[spans.STAGE_ADMISSION].attributes or {}) == {
        spans.ATTR_CANDIDATES: 3,
        spans.ATTR_OUTCOME: "admitted",
    }
    assert by_name[spans.STAGE_PRODUCERS].attributes[spans.ATTR_PRODUCERS]  # type: ignore[index]

    schedule = by_name[spans.STAGE_SCHEDULE]
    (profile,) = children(found, schedule)
    assert profile.name == spans.STAGE_PROFILE
    assert dict(profile.attributes or {}) == {
        spans.ATTR_PROFILE_NAME: "default",
        spans.ATTR_CANDIDATES: 3,
        spans.ATTR_TARGETS: ("192.168.1.2:8000",),
    }
    assert dict(schedule.attributes or {})[spans.ATTR_PROFILE_RESULTS] == ("default=192.168.1.2:8000",)
    pick = dict(by_name[spans.STAGE_PICK].attributes or {})
    assert pick[spans.ATTR_DESTINATION] == "192.168.1.2:8000"
    assert pick[spans.ATTR_PRIMARY_PROFILE] == "default"

    upstream = set_headers(replies[0])
    assert upstream["x-gateway-destination-endpoint"] == "192.168.1.2:8000"
    assert upstream[spans.TRACEPARENT] == f"00-{TRACE_ID}-{request.context.span_id:016x}-01"


async def test_failed_stage_is_marked_and_later_stages_absent(
    harness: TracedHarness, exporter: InMemorySpanExporter
) -> None:
    msgs = traced("x", "my-model")
    await harness.exchange([msgs[0], req_body(b'{"prompt":"hello world"}')])
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    parse = by_name[spans.STAGE_PARSE]
    assert parse.status.status_code == StatusCode.ERROR
    assert "model not found in request body" in (parse.status.description or "")
    assert spans.STAGE_SCHEDULE not in by_name and spans.STAGE_PICK not in by_name


async def test_unsampled_request_records_nothing_but_still_propagates(
    harness: TracedHarness, exporter: InMemorySpanExporter
) -> None:
    replies = await harness.exchange(traced("test1", "my-model", sampled=False))
    assert exporter.get_finished_spans() == ()
    upstream = set_headers(replies[0])
    assert upstream["x-gateway-destination-endpoint"] == "192.168.1.2:8000"
    assert upstream[spans.TRACEPARENT].startswith(f"00-{TRACE_ID}-")
    assert upstream[spans.TRACEPARENT].endswith("-00")


def test_each_profile_gets_a_span_and_a_failed_one_says_so(exporter: InMemorySpanExporter) -> None:
    """Two profiles under one handler: a span each under ``epp.schedule``; the filtered-out one is an error."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    eps = [endpoint(0), endpoint(1)]
    everyone = {e.metadata.pod_name for e in eps}
    plain = Scheduler(
        build(MultiProfileHandler),
        [
            SchedulerProfile("decode", filters=[], scorers=[], picker=build(MaxScorePicker)),
            SchedulerProfile(
                "prefill",
                filters=[DropFilter("none", everyone, [])],
                scorers=[],
                picker=build(MaxScorePicker),
            ),
        ],
    )
    scheduler = traced_scheduler(plain)
    assert scheduler is not plain
    parent = tracer.start_span("epp.schedule")
    token = CURRENT.set(StageSpans(tracer, Context()).under(parent))
    try:
        result = scheduler.schedule(CycleState(), request(), eps)
    finally:
        CURRENT.reset(token)
    parent.end()
    assert result.profile_results["prefill"] is None
    runs = {
        dict(s.attributes or {})[spans.ATTR_PROFILE_NAME]: s
        for s in exporter.get_finished_spans()
        if s.name == spans.STAGE_PROFILE
    }
    assert set(runs) == {"decode", "prefill"}
    for s in runs.values():
        assert s.parent is not None and s.parent.span_id == parent.get_span_context().span_id
    assert runs["decode"].status.status_code != StatusCode.ERROR
    assert len(dict(runs["decode"].attributes or {})[spans.ATTR_TARGETS]) == 1  # type: ignore[arg-type]
    assert runs["prefill"].status.status_code == StatusCode.ERROR
    # Outside a traced request the same profiles record nothing.
    exporter.clear()
    scheduler.schedule(CycleState(), request(), eps)
    assert exporter.get_finished_spans() == ()
    provider.shutdown()
