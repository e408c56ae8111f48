"""Child spans of ``gateway.request_orchestration``, one per routing stage, with the decision as attributes.

Only sampled requests get a ``StageSpans`` (the director's stage observer opens and closes the
routing stages' spans with it); elsewhere ``stages`` is ``None``, and ``stage(None, ...)``, which
a scheduler profile run uses, is a shared no-op context manager (no allocation, two trivial calls).
"""

from __future__ import annotations

from contextvars import ContextVar
from types import TracebackType
from typing import Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

# The stage spans a scheduler profile run hangs from (set around the scheduler call only).
CURRENT: Final[ContextVar[StageSpans | None]] = ContextVar("epp_stage_spans", default=None)


class StageSpans:
    """Starts internal spans under one parent span."""

    __slots__ = ("_parent", "_tracer")

    def __init__(self, tracer: Tracer, parent: Context) -> None:
        self._tracer = tracer
        self._parent = parent

    def start(self, name: str) -> Span:
        return self._tracer.start_span(name, context=self._parent, kind=SpanKind.INTERNAL)

    def under(self, span: Span) -> StageSpans:
        """Spans started from the result are children of ``span``."""
        return StageSpans(self._tracer, trace_api.set_span_in_context(span, self._parent))


def fail(span: Span | None, exc: BaseException) -> None:
    """End ``span`` (if any) with ``exc`` recorded and an error status."""
    if span is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()


class _Stage:
    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            fail(self.span, exc)
        else:
            self.span.end()


class _NoStage:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


NO_STAGE: Final = _NoStage()


def stage(stages: StageSpans | None, name: str) -> _Stage | _NoStage:
    """``with stage(ctx.stages, "epp.parse") as span:`` — ``span`` is None when not traced."""
    return NO_STAGE if stages is None else _Stage(stages.start(name))
