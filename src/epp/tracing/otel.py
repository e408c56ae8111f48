"""OpenTelemetry setup from flags and env, and the per-request span helpers the server calls."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import getrandbits
from typing import ClassVar, Final, Protocol

import structlog
from opentelemetry import trace as trace_api
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagate import set_global_textmap
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from epp import __version__
from epp.tracing import spans
from epp.tracing.stages import StageSpans

log = structlog.get_logger(__name__)

_NO_HEADERS: Final[tuple[tuple[str, str], ...]] = ()
_FLUSH_TIMEOUT_MS: Final = 5_000
_ROOT: Final = Context()  # contexts are immutable: the parent of every span that has no remote one
_UNSAMPLED_ROOT: Final = TraceFlags(TraceFlags.RANDOM_TRACE_ID)  # as the SDK flags a dropped random root
_TRACEPARENT_V00: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACE_ID_LIMIT: Final = (1 << 64) - 1  # TraceIdRatioBased compares the low 64 bits of the id


class TracingOptions(Protocol):
    """What tracing reads from ``epp.cli.flags.Options``."""

    @property
    def tracing(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The ``gateway.request`` span of one stream, with the context its children hang from."""

    span: Span
    context: Context | None  # None when unsampled: a child would record nothing
    baggage: str  # the incoming baggage header, "" when none


class Tracing:
    """Tracing switched off: every helper returns at once, so the server calls them unguarded."""

    enabled: ClassVar[bool] = False

    def start_request(self, headers: Mapping[str, str]) -> RequestTrace | None:
        return None

    def end_request(self, trace: RequestTrace | None) -> None:
        return None

    def start_orchestration(self, trace: RequestTrace | None) -> Span | None:
        return None

    def end_orchestration(self, span: Span | None, *, target_model: str = "", priority: int = 0) -> None:
        return None

    def stages(self, span: Span | None) -> StageSpans | None:
        """The per-stage child spans of an orchestration span (None when it records nothing)."""
        return None

    def inject(self, trace: RequestTrace | None) -> Sequence[tuple[str, str]]:
        """Trace headers for the upstream request: ``traceparent`` (+ ``tracestate``, ``baggage``)."""
        return _NO_HEADERS

    def shutdown(self) -> None:
        """Flush and stop exporting; blocks up to a few seconds (call it off the event loop)."""
        return None


class _IdGenerator(RandomIdGenerator):
    """Random ids, except that ``start_request`` may choose the next root's trace id itself."""

    def __init__(self) -> None:
        self.preset = 0

    def generate_trace_id(self) -> int:
        trace_id, self.preset = self.preset, 0
        return trace_id or super().generate_trace_id()


def _span_id() -> int:
    return getrandbits(64) or 1


def _unsampled_remote(traceparent: str, tracestate: str | None) -> NonRecordingSpan | None:
    """The span for a well-formed version-00 ``traceparent`` whose sampled flag is off, else None.

    The common unsampled case without the propagator machinery; anything else (sampled,
    other versions, malformed) returns None and takes the full path.
    """
    m = _TRACEPARENT_V00.fullmatch(traceparent)
    if m is None:
        return None
    flags = int(m[3], 16)
    if flags & TraceFlags.SAMPLED:
        return None
    trace_id, span_id = int(m[1], 16), int(m[2], 16)
    if trace_id == 0 or span_id == 0:
        return None
    state = TraceState.from_header([tracestate]) if tracestate else None
    # As the SDK does for a child: not sampled, and the parent's random-trace-id bit kept.
    ctx = SpanContext(trace_id, _span_id(), False, TraceFlags(flags & TraceFlags.RANDOM_TRACE_ID), state)
    return NonRecordingSpan(ctx)


class OtelTracing(Tracing):
    """Tracing through an OpenTelemetry SDK ``TracerProvider`` sampling ParentBased(TraceIdRatio)."""

    enabled: ClassVar[bool] = True

    def __init__(self, provider: TracerProvider, ids: _IdGenerator, root_sampler: TraceIdRatioBased) -> None:
        self._provider = provider
        self._id_generator = ids
        self._root_bound = root_sampler.bound
        self._request_tracer = provider.get_tracer(spans.REQUEST_TRACER)
        self._orchestration_tracer = provider.get_tracer(spans.ORCHESTRATION_TRACER)
        self._stage_tracer = provider.get_tracer(spans.STAGE_TRACER)
        self._traceparent = TraceContextTextMapPropagator()
        self.propagator = CompositePropagator([self._traceparent, W3CBaggagePropagator()])  # the global one

    def start_request(self, headers: Mapping[str, str]) -> RequestTrace:
        """Start ``gateway.request``, child of the client's ``traceparent`` when it sent one.

        Unsampled requests (90% by default) never reach the SDK, whose sampler alone costs
        several microseconds: the decision is taken here, on the same trace id and with the
        same test as ParentBased(TraceIdRatioBased), and the span is a bare NonRecordingSpan.
        Incoming ``baggage`` is passed upstream verbatim (re-encoding it could only lose).
        """
        baggage = headers.get(spans.BAGGAGE, "")
        traceparent = headers.get(spans.TRACEPARENT)
        if traceparent is not None:
            unsampled = _unsampled_remote(traceparent, headers.get(spans.TRACESTATE))
            if unsampled is not None:
                return RequestTrace(unsampled, None, baggage)
            parent = self._traceparent.extract(headers)
            remote = trace_api.get_current_span(parent).get_span_context()
            if remote.is_valid:
                if not remote.trace_flags.sampled:  # e.g. a future traceparent version
                    flags = TraceFlags(remote.trace_flags & TraceFlags.RANDOM_TRACE_ID)
                    ctx = SpanContext(remote.trace_id, _span_id(), False, flags, remote.trace_state)
                    return RequestTrace(NonRecordingSpan(ctx), None, baggage)
                return self._sampled(parent, baggage)
        trace_id = getrandbits(128) or 1
        if trace_id & _TRACE_ID_LIMIT >= self._root_bound:
            ctx = SpanContext(trace_id, _span_id(), False, _UNSAMPLED_ROOT)
            return RequestTrace(NonRecordingSpan(ctx), None, baggage)
        self._id_generator.preset = trace_id  # the SDK's sampler then tests this very id and samples it too
        return self._sampled(_ROOT, baggage)

    def _sampled(self, parent: Context, baggage: str) -> RequestTrace:
        span = self._request_tracer.start_span(spans.REQUEST_SPAN, context=parent, kind=SpanKind.SERVER)
        return RequestTrace(span, trace_api.set_span_in_context(span, parent), baggage)

    def end_request(self, trace: RequestTrace | None) -> None:
        if trace is not None:
            trace.span.end()

    def start_orchestration(self, trace: RequestTrace | None) -> Span | None:
        if trace is None or trace.context is None:
            return None
        return self._orchestration_tracer.start_span(
            spans.ORCHESTRATION_SPAN, context=trace.context, kind=SpanKind.SERVER
        )

    def end_orchestration(self, span: Span | None, *, target_model: str = "", priority: int = 0) -> None:
        if span is None:
            return
        span.set_attribute(spans.ATTR_TARGET_MODEL, target_model)
        span.set_attribute(spans.ATTR_REQUEST_PRIO, priority)
        span.end()

    def stages(self, span: Span | None) -> StageSpans | None:
        if span is None or not span.is_recording():
            return None
        return StageSpans(self._stage_tracer, trace_api.set_span_in_context(span))

    def inject(self, trace: RequestTrace | None) -> Sequence[tuple[str, str]]:
        # Formatted by hand: the propagator API costs several times more.  Unsampled spans are
        # injected too (flags 00), so the model server keeps the trace id and the decision.
        if trace is None:
            return _NO_HEADERS
        ctx = trace.span.get_span_context()
        out = [(spans.TRACEPARENT, f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}")]
        if ctx.trace_state:
            out.append((spans.TRACESTATE, ctx.trace_state.to_header()))
        if trace.baggage:
            out.append((spans.BAGGAGE, trace.baggage))
        return out

    def shutdown(self) -> None:
        self._provider.force_flush(_FLUSH_TIMEOUT_MS)
        self._provider.shutdown()


def sample_ratio_from_env(env: Mapping[str, str]) -> float:
    """GIE's sampler is ParentBased(TraceIdRatio(r)), the only kind supported; this is r (default 0.1)."""
    kind = env.get(spans.ENV_SAMPLER, spans.SUPPORTED_SAMPLER)
    if kind != spans.SUPPORTED_SAMPLER:
        log.warning(
            "tracing_sampler_unsupported",
            sampler=kind,
            fallback=f"{spans.SUPPORTED_SAMPLER} with ratio {spans.DEFAULT_SAMPLE_RATIO}",
        )
        return spans.DEFAULT_SAMPLE_RATIO
    raw = env.get(spans.ENV_SAMPLER_ARG, "")
    try:
        ratio = float(raw) if raw else spans.DEFAULT_SAMPLE_RATIO
    except ValueError:
        ratio = math.nan
    if math.isnan(ratio):
        log.warning("tracing_sampler_arg_invalid", arg=raw, fallback=spans.DEFAULT_SAMPLE_RATIO)
        return spans.DEFAULT_SAMPLE_RATIO
    return min(max(ratio, 0.0), 1.0)  # Go's TraceIDRatioBased clamps the same way


def exporter_from_env(env: Mapping[str, str]) -> SpanExporter | None:
    """The exporter OTEL_TRACES_EXPORTER names; None (nothing exported) when unset, ``none`` or unknown."""
    kind = env.get(spans.ENV_EXPORTER, "").strip().lower()
    if kind == "otlp":
        # Imported here: the OTLP exporter pulls in its protobuf stubs, which nothing else needs.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = (
            env.get(spans.ENV_OTLP_TRACES_ENDPOINT)
            or env.get(spans.ENV_OTLP_ENDPOINT)
            or spans.DEFAULT_OTLP_ENDPOINT
        )
        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if kind == "console":
        return ConsoleSpanExporter(out=sys.stdout)
    if kind not in ("", "none"):
        log.warning("tracing_exporter_unsupported", exporter=kind, supported="otlp, console, none")
    return None


def setup_tracing(
    options: TracingOptions,
    env: Mapping[str, str],
    *,
    exporter: SpanExporter | None = None,
    install_global: bool = True,
) -> Tracing:
    """Tracing as the flags and OTEL_* variables ask; the no-op ``Tracing`` unless spans go somewhere.

    ``exporter`` overrides OTEL_TRACES_EXPORTER and exports synchronously (tests, embedding).
    ``install_global`` also sets OpenTelemetry's global provider and propagator, as GIE does,
    so plugins can use ``opentelemetry.trace.get_tracer``.
    """
    if not options.tracing or env.get(spans.ENV_SDK_DISABLED, "").strip().lower() == "true":
        return Tracing()
    synchronous = exporter is not None
    if exporter is None:
        exporter = exporter_from_env(env)
    if exporter is None:
        log.info("tracing_not_exported", reason=f"{spans.ENV_EXPORTER} is not otlp or console")
        return Tracing()
    resource = Resource.create(
        {
            "service.name": env.get(spans.ENV_SERVICE_NAME) or spans.DEFAULT_SERVICE_NAME,
            "service.version": __version__,
        }
    )
    root_sampler = TraceIdRatioBased(sample_ratio_from_env(env))
    ids = _IdGenerator()
    provider = TracerProvider(
        sampler=ParentBased(root_sampler), resource=resource, id_generator=ids, shutdown_on_exit=False
    )
    processor = SimpleSpanProcessor(exporter) if synchronous else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracing = OtelTracing(provider, ids, root_sampler)
    if install_global:
        trace_api.set_tracer_provider(provider)
        set_global_textmap(tracing.propagator)
    log.info("tracing_enabled", exporter=type(exporter).__name__, sample_ratio=root_sampler.rate)
    return tracing
