"""The director: one request's pipeline from parsed body to routing decision, and its response side.

Order (GIE §3.1): parse → model rewrite → objective priority → candidates → admission →
data producers (DAG order, shared timeout) → admit plugins → scheduler → pre-request
plugins → body repackaging.  Response side: header hooks, per-chunk body hooks, and one
completion call per scheduled request, also when the stream ends abnormally.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from epp.admission.api import AdmissionController
from epp.datalayer.api import Endpoint, fresh_or_all
from epp.datastore.store import Datastore
from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
)
from epp.director.candidates import locate
from epp.director.context import RequestContext, RoutingDecision
from epp.errors import BadRequest, EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.metrics import series
from epp.parsers.api import Parser
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult

log = structlog.get_logger(__name__)

REQUEST_ID_HEADER: Final = "x-request-id"
OBJECTIVE_HEADER: Final = "x-gateway-inference-objective"
MODEL_REWRITE_HEADER: Final = "x-gateway-model-name-rewrite"
FAIRNESS_HEADER: Final = "x-gateway-inference-fairness-id"
DEFAULT_FAIRNESS_ID: Final = "default-flow"
DEFAULT_PRODUCER_TIMEOUT: Final = 0.4


class SchedulerLike(Protocol):
    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """The plugins a director runs, already ordered (producers topologically, the rest by config)."""

    parser: Parser
    scheduler: SchedulerLike
    admission: AdmissionController
    producers: tuple[DataProducer, ...] = ()
    admitters: tuple[Admitter, ...] = ()
    pre_request: tuple[PreRequest, ...] = ()
    response_header: tuple[ResponseHeaderProcessor, ...] = ()
    response_body: tuple[ResponseBodyProcessor, ...] = ()
    response_complete: tuple[ResponseCompleteProcessor, ...] = ()
    producer_timeout: float = DEFAULT_PRODUCER_TIMEOUT
    subset_filter: bool = True
    # Endpoints whose metrics are older than this are not candidates while a fresh one
    # exists (0 disables): a dead or unreachable server stops attracting traffic once its
    # last scrape ages out, and an endpoint joins once it has been scraped.
    staleness_threshold: float = 0.0


def _timed_label(point: str, plugin: Any) -> Any:
    tn = plugin.typed_name
    return series.PLUGIN_DURATION.labels(point, tn.type, tn.name)


class Director:
    """Runs the pipeline for each request.  Stateless between requests except the RNG."""

    def __init__(self, datastore: Datastore, pipeline: Pipeline, *, rng: random.Random | None = None) -> None:
        self._ds = datastore
        self._p = pipeline
        self._rng = rng or random.Random()
        self._pre_timers = tuple((p, _timed_label("PreRequest", p)) for p in pipeline.pre_request)
        self._hdr_timers = tuple((p, _timed_label("ResponseReceived", p)) for p in pipeline.response_header)
        self._body_timers = tuple((p, _timed_label("ResponseStreaming", p)) for p in pipeline.response_body)
        self._done_timers = tuple(
            (p, _timed_label("ResponseStreaming", p)) for p in pipeline.response_complete
        )

    @property
    def pipeline(self) -> Pipeline:
        return self._p

    @property
    def response_headers_needed(self) -> bool:
        """Whether a plugin reads response headers (else lean mode skips them too)."""
        return bool(self._p.response_header)

    def response_body_needed(self, ctx: RequestContext) -> bool:
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

    # request side -----------------------------------------------------------------
    def new_request(self, headers: dict[str, str], metadata: Mapping[str, Any]) -> RequestContext:
        """Start a request from its headers; generates ``x-request-id`` when absent."""
        request_id = headers.get(REQUEST_ID_HEADER, "")
        generated = not request_id
        if generated:
            request_id = str(uuid.uuid4())
            headers[REQUEST_ID_HEADER] = request_id
        req = InferenceRequest(
            request_id=request_id,
            headers=headers,
            objective=headers.get(OBJECTIVE_HEADER, ""),
            fairness_id=headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID,
            target_model=headers.get(MODEL_REWRITE_HEADER, ""),
            metadata=metadata,
            received_at=time.monotonic(),
        )
        return RequestContext(request=req, generated_request_id=generated)

    def _extra_headers(self, ctx: RequestContext) -> tuple[tuple[str, str], ...]:
        if ctx.generated_request_id:
            return ((REQUEST_ID_HEADER, ctx.request.request_id),)
        return ()

    def route_headers_only(self, ctx: RequestContext) -> RoutingDecision:
        """A request without a body (GET ...): schedule on load alone, no plugins but the profile.

        GIE picks a uniformly random pod from the whole pool here, ignoring the subset
        hint; we honour the hint and let the scheduler prefer the least-loaded endpoint.
        """
        all_eps = self._ds.endpoints()
        if not all_eps:
            raise Internal("no pods available in datastore")
        candidates = locate(all_eps, ctx.request.metadata, subset_filter=self._p.subset_filter)
        if not candidates:
            raise ServiceUnavailable("failed to find endpoint candidates for serving the request")
        try:
            result = self._p.scheduler.schedule(ctx.state, ctx.request, candidates)
            targets = result.primary.target_endpoints
        except Exception:  # the scheduler may rely on a body; any endpoint will do for a GET
            targets = ()
        if not targets:
            targets = (candidates[self._rng.randrange(len(candidates))],)
        ctx.target = targets[0]
        return RoutingDecision(
            destination=",".join(t.hostport for t in targets),
            body=None,
            body_changed=False,
            headers=self._extra_headers(ctx),
        )

    async def route(self, ctx: RequestContext, body: bytes) -> RoutingDecision:
        """Route a request whose complete body has arrived.  Raises ``EppError``."""
        p = self._p
        req = ctx.request
        req.request_size_bytes = len(body)
        parsed = p.parser.parse_request(body, req.headers)
        req.body = parsed
        changed = False
        if parsed.json is not None:
            incoming = parsed.model
            if not incoming:
                raise BadRequest("model not found in request body")
            req.incoming_model = incoming
            target = req.target_model or incoming
            decision = self._ds.rewrites.decide(incoming, self._rng) if len(self._ds.rewrites) else None
            if decision is not None:
                target = decision.target_model
                series.MODEL_REWRITE_DECISIONS_TOTAL.labels(decision.rewrite_name, incoming, target).inc()
            req.target_model = target
            if target != incoming:
                parsed.json["model"] = target
                changed = True
                ctx.rewrite_response_model = True
        else:
            req.target_model = ""
        if req.objective:
            obj = self._ds.objective(req.objective)
            if obj is not None:
                req.priority = obj.priority

        snapshot = self._ds.endpoints()
        candidates = locate(snapshot, req.metadata, subset_filter=p.subset_filter)
        await p.admission.admit(req, candidates)  # before the empty check: flow control waits for endpoints
        if self._ds.endpoints() is not snapshot:  # the pool changed while the request waited
            candidates = locate(self._ds.endpoints(), req.metadata, subset_filter=p.subset_filter)
        if p.staleness_threshold > 0:
            candidates = fresh_or_all(candidates, time.monotonic(), p.staleness_threshold)
        if not candidates:
            raise ServiceUnavailable("failed to find endpoint candidates for serving the request")

        state = ctx.state
        if p.producers:
            await self._prepare_data(state, req, candidates)
        for admitter in p.admitters:
            reason = admitter.admit_request(state, req, candidates)
            if reason is not None:
                log.info(
                    "request_denied",
                    plugin=str(admitter.typed_name),
                    reason=reason,
                    request_id=req.request_id,
                )
                raise Internal("request cannot be admitted")
        try:
            result = p.scheduler.schedule(state, req, candidates)
            targets = result.primary.target_endpoints
        except EppError:
            raise
        except Exception as e:  # SchedulingError and any plugin failure: GIE answers 429
            raise ResourceExhausted(f"failed to find target endpoint: {e}") from e
        if not targets:
            raise Internal("results must be greater than zero")
        ctx.result = result
        ctx.target = targets[0]
        # From here on the request counts as scheduled: if a pre-request hook or the body
        # repackaging fails, finish() still runs the completion hooks that release what the
        # pre-request hooks took (in-flight counters).
        ctx.scheduled = True
        for plugin, timer in self._pre_timers:
            t0 = time.perf_counter()
            plugin.pre_request(state, req, result)
            timer.observe(time.perf_counter() - t0)

        out = p.parser.serialize_request(parsed) if changed else body
        series.REQUEST_TOTAL.labels(req.incoming_model, req.target_model, str(req.priority)).inc()
        series.REQUEST_SIZES.labels(req.incoming_model, req.target_model).observe(len(body))
        return RoutingDecision(
            destination=targets[0].hostport if len(targets) == 1 else ",".join(t.hostport for t in targets),
            body=out,
            body_changed=out is not body,
            headers=self._extra_headers(ctx),
        )

    async def _prepare_data(self, state: CycleState, req: InferenceRequest, eps: Sequence[Endpoint]) -> None:
        """Run producers in DAG order under one timeout; a failure is logged and the request goes on.

        Unlike Go, a failing producer does not skip the producers after it: each runs, and
        consumers of missing data see no attribute (scorers treat that as no signal).
        """
        try:
            async with asyncio.timeout(self._p.producer_timeout):
                for producer in self._p.producers:
                    try:
                        await producer.prepare_request_data(state, req, eps)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.warning(
                            "prepare_data_failed",
                            plugin=str(producer.typed_name),
                            request_id=req.request_id,
                            exc_info=True,
                        )
        except TimeoutError:
            log.warning("prepare_data_timed_out", request_id=req.request_id, timeout=self._p.producer_timeout)

    def request_sent(self, ctx: RequestContext) -> None:
        """The routing reply went out: count the request as running."""
        if ctx.scheduled and ctx.request.incoming_model:
            series.RUNNING_REQUESTS.labels(ctx.request.incoming_model).inc()
            ctx.running_counted = True

    # response side ----------------------------------------------------------------
    def response_headers(self, ctx: RequestContext, headers: dict[str, str]) -> None:
        """Record the response headers; run header hooks (they may add to ``headers``)."""
        resp = ctx.response = ResponseInfo(request_id=ctx.request.request_id, headers=headers)
        status = headers.get(":status", "")
        resp.status = int(status) if status.isdigit() else 0
        if resp.status and not 200 <= resp.status < 300 and not ctx.error_code:
            ctx.error_code = "ModelServerError"
        resp.streaming = "text/event-stream" in headers.get("content-type", "")
        if ctx.scheduled:
            ctx.usage_parser = self._p.parser.usage_parser(headers)
        for plugin, timer in self._hdr_timers:
            t0 = time.perf_counter()
            plugin.response_header(ctx.state, ctx.request, resp, ctx.target)
            timer.observe(time.perf_counter() - t0)

    def response_body(self, ctx: RequestContext, chunk: bytes, end_of_stream: bool) -> bytes:
        """Account one response chunk; returns the chunk to forward (model name restored)."""
        resp = ctx.response
        if resp is None:  # a body without headers: be lenient
            resp = ctx.response = ResponseInfo(request_id=ctx.request.request_id)
        if chunk:
            if not resp.first_chunk_at:
                resp.first_chunk_at = time.monotonic()
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
        for plugin, timer in self._body_timers:
            t0 = time.perf_counter()
            plugin.response_body(ctx.state, ctx.request, resp, chunk, ctx.target)
            timer.observe(time.perf_counter() - t0)
        if end_of_stream:
            self._complete(ctx)
        if ctx.rewrite_response_model and chunk:
            return rewrite_model_name(chunk, ctx.request.target_model, ctx.request.incoming_model)
        return chunk

    def _complete(self, ctx: RequestContext) -> None:
        if ctx.completed:
            return
        ctx.completed = True
        resp = ctx.response
        if resp is None:
            resp = ctx.response = ResponseInfo(request_id=ctx.request.request_id)
        now = time.monotonic()
        resp.completed_at = now
        for plugin, timer in self._done_timers:
            t0 = time.perf_counter()
            try:
                plugin.response_complete(ctx.state, ctx.request, resp, ctx.target)
            except Exception:
                log.warning("response_complete_failed", plugin=str(plugin.typed_name), exc_info=True)
            timer.observe(time.perf_counter() - t0)
        if ctx.scheduled and resp.end_of_stream:
            self._record_response_metrics(ctx, resp, now)
        self._p.admission.notify()

    def _record_response_metrics(self, ctx: RequestContext, resp: ResponseInfo, now: float) -> None:
        req = ctx.request
        labels = (req.incoming_model, req.target_model)
        elapsed = now - req.received_at
        series.REQUEST_DURATION.labels(*labels).observe(elapsed)
        series.RESPONSE_SIZES.labels(*labels).observe(resp.body_bytes)
        usage = resp.usage
        if usage is not None:
            if usage.prompt_tokens > 0:
                series.INPUT_TOKENS.labels(*labels).observe(usage.prompt_tokens)
            if usage.completion_tokens > 0:
                series.OUTPUT_TOKENS.labels(*labels).observe(usage.completion_tokens)
                series.NORMALIZED_TPOT.labels(*labels).observe(elapsed / usage.completion_tokens)
            if usage.cached_tokens is not None:
                series.PROMPT_CACHED_TOKENS.labels(*labels).observe(usage.cached_tokens)
        if resp.streaming and resp.first_chunk_at:
            series.REQUEST_TTFT.labels(*labels).observe(resp.first_chunk_at - req.received_at)
            if usage is not None and usage.completion_tokens > 1:
                tpot = (now - resp.first_chunk_at) / (usage.completion_tokens - 1)
                series.REQUEST_TPOT.labels(*labels).observe(tpot)

    def finish(self, ctx: RequestContext, error: EppError | None = None) -> None:
        """The ext_proc stream ended (normally, with an error, or cancelled). Runs exactly once."""
        if error is not None and not ctx.error_code:
            ctx.error_code = error.code
        if ctx.scheduled and not ctx.completed:
            self._complete(ctx)  # abnormal end: completion hooks release per-request state
        if ctx.running_counted:
            series.RUNNING_REQUESTS.labels(ctx.request.incoming_model).dec()
            ctx.running_counted = False
        if ctx.error_code:
            req = ctx.request
            series.REQUEST_ERROR_TOTAL.labels(req.incoming_model, req.target_model, ctx.error_code).inc()


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
