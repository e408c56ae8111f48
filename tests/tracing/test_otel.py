"""Tracing: setup from flags/env, GIE's spans under a client traceparent, injected headers, no-op paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from epp.tracing import spans
from epp.tracing.otel import (
    OtelTracing,
    Tracing,
    exporter_from_env,
    sample_ratio_from_env,
    setup_tracing,
)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
SAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-01"
UNSAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-00"
Make = Callable[..., OtelTracing]


@dataclass(frozen=True)
class Opts:
    tracing: bool = True


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def make(exporter: InMemorySpanExporter) -> Iterator[Make]:
    """Build an enabled Tracing exporting into ``exporter``; shut every one down afterwards."""
    made: list[Tracing] = []

    def build(ratio: str = "0.1") -> OtelTracing:
        t = setup_tracing(Opts(), {spans.ENV_SAMPLER_ARG: ratio}, exporter=exporter, install_global=False)
        assert isinstance(t, OtelTracing)
        made.append(t)
        return t

    yield build
    for t in made:
        t.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def run_request(tracing: Tracing, headers: dict[str, str]) -> Sequence[tuple[str, str]]:
    """What the server and director do per request: both spans, headers injected mid-way."""
    trace = tracing.start_request(headers)
    span = tracing.start_orchestration(trace)
    tracing.end_orchestration(span, target_model="llama-3", priority=2)
    injected = tracing.inject(trace)
    tracing.end_request(trace)
    return injected


@pytest.mark.parametrize(
    ("opts", "env"),
    [
        pytest.param(Opts(tracing=False), {spans.ENV_EXPORTER: "console"}, id="flag-off"),
        pytest.param(Opts(), {}, id="no-exporter-configured"),
        pytest.param(Opts(), {spans.ENV_EXPORTER: "none"}, id="exporter-none"),
        pytest.param(Opts(), {spans.ENV_EXPORTER: "zipkin"}, id="exporter-unknown"),
        pytest.param(Opts(), {spans.ENV_EXPORTER: "otlp", spans.ENV_SDK_DISABLED: "true"}, id="sdk-disabled"),
    ],
)
def test_disabled_is_a_no_op(opts: Opts, env: dict[str, str]) -> None:
    """Tracing off, or nowhere to send spans, gives the no-op Tracing: no spans, no injected headers."""
    tracing = setup_tracing(opts, env, install_global=False)
    assert type(tracing) is Tracing
    assert not tracing.enabled
    assert run_request(tracing, {spans.TRACEPARENT: SAMPLED}) == ()
    assert tracing.start_request({}) is None
    tracing.shutdown()


def test_spans_hang_from_client_traceparent(make: Make, exporter: InMemorySpanExporter) -> None:
    """gateway.request is a server span under the client's; orchestration is its child, with GIE's attrs."""
    tracing = make("0")  # ratio 0: only a sampled parent can cause these spans
    run_request(tracing, {spans.TRACEPARENT: SAMPLED, ":path": "/v1/completions"})
    found = by_name(exporter)
    request, orchestration = found[spans.REQUEST_SPAN], found[spans.ORCHESTRATION_SPAN]
    assert request.context is not None
    assert orchestration.context is not None
    assert f"{request.context.trace_id:032x}" == TRACE_ID
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.kind == SpanKind.SERVER
    assert request.instrumentation_scope is not None
    assert request.instrumentation_scope.name == spans.REQUEST_TRACER
    assert orchestration.parent is not None
    assert orchestration.parent.span_id == request.context.span_id
    assert orchestration.kind == SpanKind.SERVER
    assert orchestration.instrumentation_scope is not None
    assert orchestration.instrumentation_scope.name == spans.ORCHESTRATION_TRACER
    assert dict(orchestration.attributes or {}) == {
        spans.ATTR_TARGET_MODEL: "llama-3",
        spans.ATTR_REQUEST_PRIO: 2,
    }


def test_injected_headers_continue_the_trace(make: Make, exporter: InMemorySpanExporter) -> None:
    """Upstream gets traceparent naming the gateway.request span, tracestate, and the baggage verbatim."""
    tracing = make("0")
    headers = {spans.TRACEPARENT: SAMPLED, spans.TRACESTATE: "vendor=abc", spans.BAGGAGE: "tenant=a%20b"}
    injected = dict(run_request(tracing, headers))
    request = by_name(exporter)[spans.REQUEST_SPAN]
    assert request.context is not None
    assert injected == {
        spans.TRACEPARENT: f"00-{TRACE_ID}-{request.context.span_id:016x}-01",
        spans.TRACESTATE: "vendor=abc",
        spans.BAGGAGE: "tenant=a%20b",
    }


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({spans.TRACEPARENT: UNSAMPLED, spans.TRACESTATE: "vendor=abc"}, id="fast-path"),
        pytest.param(
            {spans.TRACEPARENT: UNSAMPLED, spans.TRACESTATE: "vendor=abc", spans.BAGGAGE: "k=v"}, id="full"
        ),
    ],
)
def test_unsampled_parent_records_nothing_but_propagates(
    make: Make, exporter: InMemorySpanExporter, headers: dict[str, str]
) -> None:
    """A not-sampled client trace exports nothing, yet upstream keeps its trace id, state and the decision."""
    tracing = make("1")  # ratio 1: the parent's decision must still win
    injected = dict(run_request(tracing, headers))
    assert exporter.get_finished_spans() == ()
    version, trace_id, span_id, flags = injected[spans.TRACEPARENT].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "00")
    assert span_id not in (PARENT_ID, "0" * 16)
    assert injected[spans.TRACESTATE] == "vendor=abc"


@pytest.mark.parametrize(
    ("ratio", "exported", "flags"),
    # 0x02 is W3C level 2's random-trace-id flag, which the SDK sets on the roots it starts.
    [pytest.param("1", 2, "03", id="ratio-1-sampled"), pytest.param("0", 0, "02", id="ratio-0-dropped")],
)
def test_root_requests_follow_the_ratio(
    make: Make, exporter: InMemorySpanExporter, ratio: str, exported: int, flags: str
) -> None:
    """Without a traceparent the request starts a new trace, sampled by the ratio; headers say which."""
    tracing = make(ratio)
    injected = dict(run_request(tracing, {":path": "/v1/completions"}))
    spans_out = exporter.get_finished_spans()
    assert len(spans_out) == exported
    assert all(s.parent is None for s in spans_out if s.name == spans.REQUEST_SPAN)
    version, trace_id, _, got_flags = injected[spans.TRACEPARENT].split("-")
    assert (version, got_flags) == ("00", flags)
    assert trace_id != TRACE_ID


def test_root_sampling_rate_is_the_ratio_not_its_square(make: Make, exporter: InMemorySpanExporter) -> None:
    """The early decision and the SDK's agree on the same trace id, so a 0.5 ratio samples about half."""
    tracing = make("0.5")
    n = 2000
    for _ in range(n):
        tracing.end_request(tracing.start_request({}))
    sampled = len(exporter.get_finished_spans())
    assert 0.4 * n < sampled < 0.6 * n  # 0.25 (a double roll) or 1.0 would be far outside; ~7 sigma


@pytest.mark.parametrize(
    "traceparent",
    [
        pytest.param(SAMPLED.upper(), id="uppercase"),
        pytest.param(f"00-{'0' * 32}-{PARENT_ID}-01", id="zero-trace-id"),
        pytest.param("garbage", id="garbage"),
    ],
)
def test_malformed_traceparent_starts_a_new_trace(
    make: Make, exporter: InMemorySpanExporter, traceparent: str
) -> None:
    """An invalid traceparent is ignored (W3C): the request becomes a root with a fresh trace id."""
    tracing = make("1")
    run_request(tracing, {spans.TRACEPARENT: traceparent})
    request = by_name(exporter)[spans.REQUEST_SPAN]
    assert request.parent is None
    assert request.context is not None
    assert f"{request.context.trace_id:032x}" != TRACE_ID


@pytest.mark.parametrize(
    ("env", "ratio"),
    [
        pytest.param({}, 0.1, id="default"),
        pytest.param({spans.ENV_SAMPLER_ARG: "0.25"}, 0.25, id="arg"),
        pytest.param(
            {spans.ENV_SAMPLER: "parentbased_traceidratio", spans.ENV_SAMPLER_ARG: "1"}, 1.0, id="explicit"
        ),
        pytest.param({spans.ENV_SAMPLER_ARG: "abc"}, 0.1, id="bad-arg-falls-back"),
        pytest.param({spans.ENV_SAMPLER_ARG: "nan"}, 0.1, id="nan-falls-back"),
        pytest.param({spans.ENV_SAMPLER_ARG: "2"}, 1.0, id="clamped-high"),
        pytest.param({spans.ENV_SAMPLER_ARG: "-1"}, 0.0, id="clamped-low"),
        pytest.param(
            {spans.ENV_SAMPLER: "always_on", spans.ENV_SAMPLER_ARG: "0.9"}, 0.1, id="unsupported-sampler"
        ),
    ],
)
def test_sampler_env(env: dict[str, str], ratio: float) -> None:
    """Only parentbased_traceidratio is supported; anything else, or a bad arg, falls back to 0.1."""
    assert sample_ratio_from_env(env) == ratio


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        pytest.param({spans.ENV_EXPORTER: "otlp"}, OTLPSpanExporter, id="otlp"),
        pytest.param(
            {spans.ENV_EXPORTER: "OTLP", spans.ENV_OTLP_ENDPOINT: "http://collector:4317"},
            OTLPSpanExporter,
            id="otlp-endpoint",
        ),
        pytest.param({spans.ENV_EXPORTER: "console"}, ConsoleSpanExporter, id="console"),
        pytest.param({}, type(None), id="unset"),
        pytest.param({spans.ENV_EXPORTER: "jaeger"}, type(None), id="unknown"),
    ],
)
def test_exporter_from_env(env: dict[str, str], kind: type) -> None:
    """OTEL_TRACES_EXPORTER picks OTLP/gRPC or console; unset or unknown exports nothing."""
    exporter = exporter_from_env(env)
    assert isinstance(exporter, kind)
    if exporter is not None:
        exporter.shutdown()


class RecordingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported: list[str] = []
        self.stopped = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += [s.name for s in spans]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.stopped = True


def test_shutdown_flushes_and_stops_the_exporter() -> None:
    """shutdown() hands every ended span to the exporter and then stops it."""
    exporter = RecordingExporter()
    tracing = setup_tracing(Opts(), {spans.ENV_SAMPLER_ARG: "1"}, exporter=exporter, install_global=False)
    run_request(tracing, {})
    tracing.shutdown()
    assert sorted(exporter.exported) == [spans.REQUEST_SPAN, spans.ORCHESTRATION_SPAN]
    assert exporter.stopped
