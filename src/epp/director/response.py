"""The director's response side: response hooks, per-chunk accounting, completion and metrics.

Routing (director.py) ends when the decision is handed out; everything after it is here:
header hooks, per-chunk work (TTFT, usage parsing, body hooks, restoring the client's model
name), completion hooks and the response metrics (running requests, duration, sizes, tokens,
errors).  ``ResponseSide`` keeps no per-request state: it is called with a request's
``RequestContext`` by that request's ``RequestLifecycle`` (lifecycle.py), which decides *when*
(each step once, in order, also when the stream ends abnormally); this module says *what*.
"""

from __future__ import annotations

from time import monotonic, perf_counter
from typing import Any, Final

import structlog

from epp.datastore.store import Datastore
from epp.director.after_reply import AfterReply, after_reply_only
from epp.director.context import RequestContext
from epp.director.pipeline import Pipeline
from epp.errors import EppError
from epp.metrics import series
from epp.parsers.registry import ParserRegistry
from epp.request import ResponseInfo

log = structlog.get_logger(__name__)


def plugin_timer(point: str, plugin: Any) -> Any:
    """The ``plugin_duration`` histogram child of one plugin at one extension point."""
    tn = plugin.typed_name
    return series.PLUGIN_DURATION.labels(point, tn.type, tn.name)


class ResponseSide:
    """Response hooks and metrics of one director's pipeline."""

    __slots__ = (
        "_body_timers",
        "_by_model",
        "_done_timers",
        "_ds",
        "_hdr_timers",
        "_later_body_timers",
        "_notify",
        "_p",
        "_running",
        "after",
        "chunks_later",
        "closed",
        "ends_later",
        "headers_later",
        "headers_needed",
        "opened",
    )

    def __init__(self, datastore: Datastore, pipeline: Pipeline, after: AfterReply | None = None) -> None:
        self._ds = datastore
        self._p = pipeline
        # Work that may wait until the reply it follows is written (director.after_reply): the
        # lifecycle defers a step when ``after`` is enabled and every hook the step runs only
        # records (``AFTER_REPLY``): the header step (``headers_later``), a chunk read with it
        # (``chunks_later``), the last chunk with the completion (``ends_later``).
        self.after = after if after is not None else AfterReply()
        self.headers_later = after_reply_only(pipeline.response_header)
        self.chunks_later = after_reply_only(pipeline.response_body)
        self.ends_later = self.chunks_later and after_reply_only(pipeline.response_complete)
        # Admission's ``notify`` at each completion, unless it tracks nothing (``TRACKS``).
        admission = pipeline.admission
        self._notify = admission.notify if getattr(admission, "TRACKS", True) else None
        # Each hook with its ``plugin_duration`` child's bound ``observe``: the loops below run per
        # chunk, and a clock read through ``time.`` or an ``observe`` looked up on the child costs
        # ~250 instructions a timed call more.
        self._hdr_timers = tuple(
            (p, plugin_timer("ResponseReceived", p).observe) for p in pipeline.response_header
        )
        self._body_timers = tuple(
            (p, plugin_timer("ResponseStreaming", p).observe) for p in pipeline.response_body
        )
        # After the first body byte: the same hooks less those that act on it only
        # (``FIRST_BYTE_ONLY``, api.ResponseBodyProcessor), in the same order.
        self._later_body_timers = tuple(
            t for t in self._body_timers if not getattr(t[0], "FIRST_BYTE_ONLY", False)
        )
        self._done_timers = tuple(
            (p, plugin_timer("ResponseStreaming", p).observe) for p in pipeline.response_complete
        )
        # Metric children bound once per model, not looked up by label per request (~1.8k
        # instructions a lookup): the running gauge by incoming model, the response histograms
        # by (incoming, target) (``_record_response_metrics``).
        self._running: dict[str, Any] = {}
        self._by_model: dict[tuple[str, str], list[Any]] = {}
        # Whether a plugin reads response headers (else lean mode skips them too: endpoint health
        # then hears only the scrapes, and the stream's end, which comes right after routing).
        self.headers_needed = bool(pipeline.response_header)
        # Lifecycles started on / closed off this pipeline: a live reload stops the plugins
        # of a replaced pipeline once no request uses it any more.
        self.opened = 0
        self.closed = 0

    @property
    def in_flight(self) -> int:
        return self.opened - self.closed

    def body_needed(self, ctx: RequestContext) -> bool:
        """Whether this request's response body must reach the EPP.

        Plugins with body or completion hooks need it, and so does restoring the client's
        model name after a rewrite (a header rewrite, or any InferenceModelRewrite rule).
        Token and TTFT metrics are recorded only when bodies flow anyway: asking for them
        is what a FULL_DUPLEX_STREAMED response mode in Envoy's config expresses.
        """
        p = self._p
        return bool(
            p.response_body or p.response_complete or ctx.request.target_model or len(self._ds.rewrites)
        )

    def request_sent(self, ctx: RequestContext) -> bool:
        """The routing decision went out: count a scheduled request as running; True if counted.

        Its endpoint's health starts waiting for the response headers.
        """
        if ctx.target is not None:
            ctx.target.health.sent(monotonic())
        model = ctx.request.incoming_model
        if ctx.result is not None and model:
            running = self._running.get(model)
            if running is None:
                if len(self._running) >= _MODELS_MAX:
                    self._running.clear()
                running = self._running[model] = series.RUNNING_REQUESTS.labels(model)
            ctx.running = running
            running.inc()
            return True
        return False

    def headers(self, ctx: RequestContext, headers: dict[str, str]) -> None:
        """Record the response headers; run header hooks (they may add to ``headers``)."""
        resp = ctx.response = ResponseInfo.started(ctx.request.request_id, headers)
        status = headers.get(":status", "")
        resp.status = int(status) if status.isdigit() else 0
        if resp.status and not 200 <= resp.status < 300 and not ctx.error_code:
            ctx.error_code = "ModelServerError"
            ctx.error_reason = f"model-server-{resp.status}"
        target = ctx.target
        if target is not None:  # health: a 5xx counts against it, any answer shows it is alive
            now = monotonic()
            target.health.headers(resp.status, now - ctx.request.received_at, now)
        resp.streaming = "text/event-stream" in headers.get("content-type", "")
        if ctx.result is not None:
            parser = ctx.parser
            if parser is None:  # no body was parsed (header-only): the sole parser, if one
                configured = self._p.parser
                parser = None if isinstance(configured, ParserRegistry) else configured
            if parser is not None:
                ctx.usage_parser = parser.usage_parser(headers)
        for plugin, observe in self._hdr_timers:
            t0 = perf_counter()
            plugin.response_header(ctx.state, ctx.request, resp, ctx.target)
            observe(perf_counter() - t0)

    def chunk(self, ctx: RequestContext, chunk: bytes, end_of_stream: bool) -> bytes:
        """Account one response chunk and run body hooks; returns the chunk to forward."""
        resp = ctx.response
        if resp is None:  # a body without headers: be lenient
            resp = ctx.response = ResponseInfo(request_id=ctx.request.request_id)
        # until the first byte has been handed to the hooks, all of them; then not the first-byte ones
        timers = self._later_body_timers if resp.first_chunk_at else self._body_timers
        if chunk:
            if not resp.first_chunk_at:
                now = resp.first_chunk_at = monotonic()
                target = ctx.target
                if target is not None:  # health: time to first token against the peers'
                    m = target.metrics
                    target.health.first_byte(
                        now - ctx.request.received_at,
                        m.waiting_queue_size,
                        m.running_requests_size,
                        resp.streaming,
                        now,
                    )
            resp.body_bytes += len(chunk)
            up = ctx.usage_parser
            if up is not None:
                usage = up.feed(chunk, end_of_stream)
                if usage is not None:
                    resp.usage = usage
        elif end_of_stream and ctx.usage_parser is not None:
            usage = ctx.usage_parser.feed(b"", True)
            if usage is not None:
                resp.usage = usage
        if end_of_stream:
            resp.end_of_stream = True
        for plugin, observe in timers:
            t0 = perf_counter()
            plugin.response_body(ctx.state, ctx.request, resp, chunk, ctx.target)
            observe(perf_counter() - t0)
        if ctx.rewrite_response_model and chunk:
            return rewrite_model_name(chunk, ctx.request.target_model, ctx.request.incoming_model)
        return chunk

    def complete(self, ctx: RequestContext) -> None:
        """Completion hooks (each failure logged, none skipped), then the response metrics."""
        resp = ctx.response
        if resp is None:
            resp = ctx.response = ResponseInfo(request_id=ctx.request.request_id)
        now = monotonic()
        resp.completed_at = now
        for plugin, observe in self._done_timers:
            t0 = perf_counter()
            try:
                plugin.response_complete(ctx.state, ctx.request, resp, ctx.target)
            except Exception:
                log.warning("response_complete_failed", plugin=str(plugin.typed_name), exc_info=True)
            observe(perf_counter() - t0)
        if ctx.result is not None and resp.end_of_stream:
            _record_response_metrics(ctx, resp, now, self._by_model)
        if self._notify is not None:
            self._notify()

    def finish(self, ctx: RequestContext, error: EppError | None, *, running: bool) -> None:
        """The request's last bookkeeping: the running gauge (if counted) and its error, once."""
        self.closed += 1
        target = ctx.target
        if target is not None:
            resp = ctx.response
            target.health.ended(resp is not None and resp.status != 0, monotonic())
        if error is not None and not ctx.error_code:
            ctx.error_code, ctx.error_reason = error.code, error.reason
        req = ctx.request
        if running:
            (ctx.running or series.RUNNING_REQUESTS.labels(req.incoming_model)).dec()
        if ctx.error_code:
            series.REQUEST_ERROR_TOTAL.labels(
                req.incoming_model, req.target_model, ctx.error_code, ctx.error_reason
            ).inc()


# The per-model response histograms, in the order of a ``_ModelSeries`` list's slots.
_DURATION, _SIZES, _INPUT, _OUTPUT, _NTPOT, _CACHED, _TTFT, _TPOT = range(8)
_FAMILIES: Final = (
    series.REQUEST_DURATION,
    series.RESPONSE_SIZES,
    series.INPUT_TOKENS,
    series.OUTPUT_TOKENS,
    series.NORMALIZED_TPOT,
    series.PROMPT_CACHED_TOKENS,
    series.REQUEST_TTFT,
    series.REQUEST_TPOT,
)
_MODELS_MAX: Final = 4096  # (incoming, target) pairs whose children are kept; then it starts again


def _bind(children: list[Any], slot: int, labels: tuple[str, str]) -> Any:
    """The histogram child of ``_FAMILIES[slot]`` for ``labels``, looked up once and kept in ``children``.

    Bound when first observed, not when the model is first seen: a series that is never
    observed must not be exported (as with ``labels(...)`` at the observation).
    """
    child = children[slot] = _FAMILIES[slot].labels(*labels)
    return child


def _record_response_metrics(
    ctx: RequestContext, resp: ResponseInfo, now: float, by_model: dict[tuple[str, str], list[Any]]
) -> None:
    req = ctx.request
    labels = (req.incoming_model, req.target_model)
    c = by_model.get(labels)
    if c is None:
        if len(by_model) >= _MODELS_MAX:
            by_model.clear()
        c = by_model[labels] = [None] * len(_FAMILIES)
    elapsed = now - req.received_at
    (c[_DURATION] or _bind(c, _DURATION, labels)).observe(elapsed)
    (c[_SIZES] or _bind(c, _SIZES, labels)).observe(resp.body_bytes)
    usage = resp.usage
    if usage is not None:
        if usage.prompt_tokens > 0:
            (c[_INPUT] or _bind(c, _INPUT, labels)).observe(usage.prompt_tokens)
        if usage.completion_tokens > 0:
            (c[_OUTPUT] or _bind(c, _OUTPUT, labels)).observe(usage.completion_tokens)
            (c[_NTPOT] or _bind(c, _NTPOT, labels)).observe(elapsed / usage.completion_tokens)
        if usage.cached_tokens is not None:
            (c[_CACHED] or _bind(c, _CACHED, labels)).observe(usage.cached_tokens)
    if resp.streaming and resp.first_chunk_at:
        (c[_TTFT] or _bind(c, _TTFT, labels)).observe(resp.first_chunk_at - req.received_at)
        if usage is not None and usage.completion_tokens > 1:
            tpot = (now - resp.first_chunk_at) / (usage.completion_tokens - 1)
            (c[_TPOT] or _bind(c, _TPOT, labels)).observe(tpot)


def rewrite_model_name(chunk: bytes, target: str, incoming: str) -> bytes:
    """Restore the client-facing model name in a response chunk (GIE's byte replacement)."""
    if not target or not incoming or target == incoming:
        return chunk
    old = b'"model":"' + target.encode() + b'"'
    if old in chunk:
        return chunk.replace(old, b'"model":"' + incoming.encode() + b'"')
    old = b'"model": "' + target.encode() + b'"'
    if old in chunk:
        return chunk.replace(old, b'"model": "' + incoming.encode() + b'"')
    return chunk
