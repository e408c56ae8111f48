"""The director's routing side: one request from its headers to a routing decision.

Order (GIE §3.1): parse → model rewrite → objective priority → candidates → admission →
data producers (DAG order, shared timeout) → admit plugins → scheduler → pre-request
plugins → body repackaging.  The director hands out one ``RequestLifecycle`` per request
(``start``); the lifecycle calls back here to route and into ``ResponseSide`` (response.py)
for the response, so routing, the response side and the per-request state each live in one
module.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.datastore.store import Datastore
from epp.director.candidates import locate, usable
from epp.director.context import RequestContext, RoutingDecision
from epp.director.lifecycle import RequestLifecycle
from epp.director.pipeline import Pipeline
from epp.director.response import ResponseSide, plugin_timer
from epp.director.traced import traced_scheduler
from epp.errors import BadRequest, EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.explain.record import REJECTED, ROUTED, Decision, breakdown, header_value, primary_trace
from epp.metrics import series
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, RequestBody
from epp.scheduling.api import PROFILE_TRACES, DisaggDecision, ProfileRunResult, SchedulingResult
from epp.tracing import spans
from epp.tracing.stages import CURRENT, StageSpans, fail, stage

# Pipeline lives in pipeline.py (the response side needs it too); callers import it from here.
__all__ = ["Director", "Pipeline", "RequestLifecycle"]

log = structlog.get_logger(__name__)

REQUEST_ID_HEADER: Final = "x-request-id"
OBJECTIVE_HEADER: Final = "x-gateway-inference-objective"
MODEL_REWRITE_HEADER: Final = "x-gateway-model-name-rewrite"
FAIRNESS_HEADER: Final = "x-gateway-inference-fairness-id"
DEFAULT_FAIRNESS_ID: Final = "default-flow"


class Director:
    """Runs the pipeline for each request.  Stateless between requests except the RNG.

    A live config reload (``swap``) puts a new pipeline in place between requests: new
    requests start on it, and each ``RequestLifecycle`` keeps the director (pipeline and
    response side) it started with until it closes.
    """

    def __init__(self, datastore: Datastore, pipeline: Pipeline, *, rng: random.Random | None = None) -> None:
        self._ds = datastore
        self._p = pipeline
        self._rng = rng or random.Random()
        self._pre_timers = tuple((p, plugin_timer("PreRequest", p)) for p in pipeline.pre_request)
        self._traced_scheduler = traced_scheduler(pipeline.scheduler)  # sampled requests: span per profile
        self.responses = ResponseSide(datastore, pipeline)
        # Whether any request may be explained: the one test a request that is not pays.
        self._explaining = bool(
            pipeline.emit_endpoint_scores or pipeline.explain_header or pipeline.decisions is not None
        )
        self._explain_header = pipeline.explain_header.lower()
        self._live: Director | None = None  # after a swap: the director new requests start on

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline new requests start on."""
        return (self._live or self)._p

    @property
    def current(self) -> Director:
        """The director new requests start on (``self`` until the first ``swap``)."""
        return self._live or self

    def swap(self, pipeline: Pipeline) -> Director:
        """New requests run ``pipeline`` from now on; returns the director they start on.

        One assignment: every request either started before it (and finishes on the
        pipeline it started with) or after it.  ``in_flight`` of the returned director of
        the previous swap tells when the old pipeline is no longer used.
        """
        live = Director(self._ds, pipeline, rng=self._rng)
        self._live = live
        return live

    @property
    def in_flight(self) -> int:
        """Requests started on this director's pipeline and not yet closed."""
        return self.responses.in_flight

    # request side -----------------------------------------------------------------
    def start(
        self, headers: dict[str, str], metadata: Mapping[str, Any], *, can_hold_response: bool = False
    ) -> RequestLifecycle:
        """Start a request from its headers; generates ``x-request-id`` when absent.

        ``can_hold_response``: the edge may forward a response chunk later than it arrived
        (ext_proc FULL_DUPLEX_STREAMED), so a body can be held whole when that is needed.
        """
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
        ctx = RequestContext(request=req, generated_request_id=generated)
        d = self._live or self
        if d._explaining:  # the pipeline the request starts on decides
            d._start_explaining(ctx, headers)
        responses = d.responses
        responses.opened += 1
        return RequestLifecycle(d, responses, ctx, can_hold_response=can_hold_response)

    def _start_explaining(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        """Decide whether the scheduler keeps traces for this request, and start its record."""
        p = self._p
        req = ctx.request
        if self._explain_header:
            value = headers.get(self._explain_header, "")
            ctx.explain_asked = bool(value) and value.lower() not in ("0", "false", "no", "off")
        req.explain = p.emit_endpoint_scores or ctx.explain_asked or p.decisions is not None
        if p.decisions is not None:
            ctx.record = Decision(req.request_id, time.time())

    def commit(self, ctx: RequestContext, error: BaseException | None) -> None:
        """Put the request's decision (if one is being recorded) into the ring; once per request."""
        rec = ctx.record
        ring = self._p.decisions
        if rec is None or ring is None:
            return
        ctx.record = None
        req = ctx.request
        rec.model = req.incoming_model
        rec.target_model = req.target_model
        traces = ctx.state.get(PROFILE_TRACES)
        if traces:
            rec.profiles = tuple(traces)
        if ctx.result is not None:
            rec.primary_profile = ctx.result.primary_profile_name
            rec.disagg = ctx.result.disagg
        if error is None:
            rec.outcome = ROUTED
        else:
            rec.outcome = REJECTED
            if isinstance(error, EppError):
                rec.reason = error.reason
            else:  # the client went away (the stream was cancelled), or a crash
                rec.reason = "cancelled" if isinstance(error, asyncio.CancelledError) else "rejected-internal"
            rec.error = str(error)
        ring.add(rec)

    def _extra_headers(self, ctx: RequestContext) -> tuple[tuple[str, str], ...]:
        if ctx.generated_request_id:
            return ((REQUEST_ID_HEADER, ctx.request.request_id),)
        return ()

    def route_headers_only(self, ctx: RequestContext) -> RoutingDecision:
        """A request without a body (GET ...): schedule on load alone, no plugins but the profile.

        Called by ``RequestLifecycle.route_headers_only``.

        GIE picks a uniformly random pod from the whole pool here, ignoring the subset
        hint; we honour the hint and let the scheduler prefer the least-loaded endpoint.
        """
        all_eps = self._ds.endpoints()
        if not all_eps:
            raise Internal("no pods available in datastore")
        candidates = locate(all_eps, ctx.request.metadata, subset_filter=self._p.subset_filter)
        if not candidates:
            raise ServiceUnavailable(
                "failed to find endpoint candidates for serving the request", reason="rejected-subset-empty"
            )
        candidates = usable(candidates, time.monotonic(), 0.0)  # available (no freshness step here)
        try:
            result = self._p.scheduler.schedule(ctx.state, ctx.request, candidates)
            targets = result.primary.target_endpoints
        except Exception:  # the scheduler may rely on a body; any endpoint will do for a GET
            targets = ()
        if not targets:
            targets = (candidates[self._rng.randrange(len(candidates))],)
        ctx.target = targets[0]
        if ctx.record is not None:
            ctx.record.destination = ",".join(t.hostport for t in targets)
        return RoutingDecision(
            destination=",".join(t.hostport for t in targets),
            body=None,
            body_changed=False,
            headers=self._extra_headers(ctx),
        )

    async def route(self, ctx: RequestContext, body: bytes) -> RoutingDecision:
        """Route a request whose complete body has arrived.  Raises ``EppError``.

        Called by ``RequestLifecycle.route``.
        """
        p = self._p
        req = ctx.request
        stages = ctx.stages
        rec = ctx.record  # --decisions-buffer-size: stage timings and what routing saw
        if rec is not None:
            rec.mark("body")  # from the request headers to the end of the body
        req.request_size_bytes = len(body)
        # Stage spans (sampled requests only) are opened and closed by hand: a with-block per
        # stage would cost every untraced request several context-manager calls.
        span = None if stages is None else stages.start(spans.STAGE_PARSE)
        try:
            parsed, changed, rewrite = self._parse(ctx, body)
        except BaseException as e:
            fail(span, e)
            raise
        if span is not None:
            span.set_attributes(
                {
                    spans.ATTR_BODY_BYTES: len(body),
                    spans.ATTR_MODEL: req.incoming_model,
                    spans.ATTR_TARGET: req.target_model,
                    spans.ATTR_MODEL_REWRITE: rewrite,
                    spans.ATTR_OBJECTIVE: req.objective,
                    spans.ATTR_PRIORITY: req.priority,
                }
            )
            span.end()
        if rec is not None:
            rec.mark("parse")

        snapshot = self._ds.endpoints()
        candidates = locate(snapshot, req.metadata, subset_filter=p.subset_filter)
        span = None if stages is None else stages.start(spans.STAGE_ADMISSION)
        try:
            # before the empty check: flow control waits for endpoints
            await p.admission.admit(req, candidates)
        except BaseException as e:
            fail(span, e)
            if rec is not None:
                rec.admission = "rejected"
            raise
        if span is not None:
            span.set_attributes({spans.ATTR_CANDIDATES: len(candidates), spans.ATTR_OUTCOME: "admitted"})
            span.end()
        if rec is not None:
            rec.mark("admission")
        # Until its pre-request hooks count it on its endpoint, the admitted request is in
        # transit: flow control counts it against the pool, so a burst does not pass whole.
        try:
            return await self._route_admitted(ctx, body, parsed, changed, candidates, snapshot)
        finally:
            p.admission.placed(req, scheduled=ctx.result is not None)

    async def _route_admitted(
        self,
        ctx: RequestContext,
        body: bytes,
        parsed: RequestBody,
        changed: bool,
        candidates: Sequence[Endpoint],
        snapshot: Sequence[Endpoint],
    ) -> RoutingDecision:
        """After admission: candidates, data producers, admit plugins, scheduler, pre-request."""
        p = self._p
        req = ctx.request
        stages = ctx.stages
        rec = ctx.record
        if self._ds.endpoints() is not snapshot:  # the pool changed while the request waited
            candidates = locate(self._ds.endpoints(), req.metadata, subset_filter=p.subset_filter)
        # Fresh metrics (when a staleness threshold is set), then not a crashed or failing replica.
        candidates = usable(candidates, time.monotonic(), p.staleness_threshold)
        if rec is not None:
            rec.candidates = candidates
        if not candidates:
            raise ServiceUnavailable(
                "failed to find endpoint candidates for serving the request",
                reason="rejected-subset-empty" if self._ds.endpoints() else "rejected-no-endpoints",
            )

        state = ctx.state
        if p.producers:
            span = None if stages is None else stages.start(spans.STAGE_PRODUCERS)
            try:
                await self._prepare_data(state, req, candidates)
            except BaseException as e:
                fail(span, e)
                raise
            if span is not None:
                span.set_attributes(
                    {
                        spans.ATTR_PRODUCERS: [str(x.typed_name) for x in p.producers],
                        spans.ATTR_CANDIDATES: len(candidates),
                    }
                )
                span.end()
            if rec is not None:
                rec.mark("producers")
        if p.admitters:
            span = None if stages is None else stages.start(spans.STAGE_ADMIT_PLUGINS)
            if span is not None:
                span.set_attribute(spans.ATTR_PLUGINS, [str(a.typed_name) for a in p.admitters])
            for admitter in p.admitters:
                reason = admitter.admit_request(state, req, candidates)
                if reason is not None:
                    log.info(
                        "request_denied",
                        plugin=str(admitter.typed_name),
                        reason=reason,
                        request_id=req.request_id,
                    )
                    if span is not None:
                        span.set_attribute(spans.ATTR_OUTCOME, f"denied by {admitter.typed_name}: {reason}")
                    err = Internal("request cannot be admitted", reason="rejected-admission")
                    if rec is not None:
                        rec.admission = "rejected"
                    fail(span, err)
                    raise err
            if span is not None:
                span.set_attribute(spans.ATTR_OUTCOME, "admitted")
                span.end()
            if rec is not None:
                rec.mark("admit-plugins")
        if rec is not None:
            rec.admission = "admitted"
        try:
            result = self._schedule(stages, state, req, candidates)
            targets = result.primary.target_endpoints
        except EppError:
            raise
        except Exception as e:  # SchedulingError and any plugin failure: GIE answers 429
            raise ResourceExhausted(
                f"failed to find target endpoint: {e}", reason="rejected-no-candidates"
            ) from e
        if rec is not None:
            rec.mark("schedule")
        if not targets:
            raise Internal("results must be greater than zero")
        # From here on the request counts as scheduled: if a pre-request hook or the body
        # repackaging fails, closing the lifecycle still runs the completion hooks that
        # release what the pre-request hooks took (in-flight counters).
        ctx.result = result
        ctx.target = targets[0]
        span = None if stages is None else stages.start(spans.STAGE_PICK)
        try:
            for plugin, timer in self._pre_timers:
                t0 = time.perf_counter()
                plugin.pre_request(state, req, result)
                timer.observe(time.perf_counter() - t0)

            out = p.parser.serialize_request(parsed) if changed else body
        except BaseException as e:
            fail(span, e)
            raise
        series.REQUEST_TOTAL.labels(req.incoming_model, req.target_model, str(req.priority)).inc()
        series.REQUEST_SIZES.labels(req.incoming_model, req.target_model).observe(len(body))
        destination = targets[0].hostport if len(targets) == 1 else ",".join(t.hostport for t in targets)
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
        if rec is not None:
            rec.mark("pick")
            rec.destination = destination
        headers = self._extra_headers(ctx)
        remove: tuple[str, ...] = ()
        mutation = req.header_mutation  # None unless a pre-request plugin (P/D) asked for one
        if mutation is not None:
            headers = (*headers, *mutation.set.items())
            remove = tuple(mutation.remove)
        if not (p.emit_endpoint_scores or ctx.explain_asked):
            return RoutingDecision(
                destination=destination,
                body=out,
                body_changed=out is not body,
                headers=headers,
                remove_headers=remove,
            )
        scored = result.primary.scored
        traces = state.get(PROFILE_TRACES)
        trace = primary_trace(traces, result.primary_profile_name) if traces else None
        if trace is not None and ctx.explain_asked:
            ctx.explain_header = header_value(trace)
        return RoutingDecision(
            destination=destination,
            body=out,
            body_changed=out is not body,
            headers=headers,
            scores={ep.hostport: round(score, 6) for ep, score in scored} if scored else None,
            remove_headers=remove,
            breakdown=breakdown(trace) if trace is not None else None,
        )

    def _parse(self, ctx: RequestContext, body: bytes) -> tuple[RequestBody, bool, str]:
        """Parse, rewrite the model, take the objective's priority: (parsed body, body changed, rewrite)."""
        req = ctx.request
        parsed = self._p.parser.parse_request(body, req.headers)
        req.body = parsed
        changed = False
        rewrite = ""
        if parsed.json is not None:
            incoming = parsed.model
            if not incoming:
                raise BadRequest("model not found in request body")
            req.incoming_model = incoming
            target = req.target_model or incoming
            decision = self._ds.rewrites.decide(incoming, self._rng) if len(self._ds.rewrites) else None
            if decision is not None:
                target = decision.target_model
                rewrite = decision.rewrite_name
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
        return parsed, changed, rewrite

    def _schedule(
        self,
        stages: StageSpans | None,
        state: CycleState,
        req: InferenceRequest,
        candidates: Sequence[Endpoint],
    ) -> SchedulingResult:
        """The scheduler's verdict; for a sampled request inside ``epp.schedule`` with a span per profile."""
        if stages is None:
            return self._p.scheduler.schedule(state, req, candidates)
        with stage(stages, spans.STAGE_SCHEDULE) as span:
            assert span is not None
            span.set_attribute(spans.ATTR_CANDIDATES, len(candidates))
            token = CURRENT.set(stages.under(span))
            try:
                result = self._traced_scheduler.schedule(state, req, candidates)
            finally:
                CURRENT.reset(token)
            span.set_attribute(spans.ATTR_PRIMARY_PROFILE, result.primary_profile_name)
            span.set_attribute(
                spans.ATTR_PROFILE_RESULTS,
                [f"{name}={_picked(r)}" for name, r in result.profile_results.items()],
            )
            return result

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
