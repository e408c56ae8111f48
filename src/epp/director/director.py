"""The director's routing side: one request from its headers to a routing decision.

Order (GIE §3.1): parse → model rewrite → objective priority → request-header plugins
(llm-d-router's; they may set the fairness id) → candidates → admission → screeners
(llm-d-router's; they cut the candidates once for every profile) →
data producers (DAG order, a shared budget or a declared timeout) → admit plugins → scheduler → pre-request
plugins → body repackaging.  The director hands out one ``RequestLifecycle`` per request
(``start``); the lifecycle calls back here to route and into ``ResponseSide`` (response.py)
for the response.  What is noted about routing (a span per stage for a sampled request, the
decision record) is observer.py's, so ``route`` reads as the pipeline it runs.
"""

from __future__ import annotations

import asyncio
import random
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, Final, NoReturn

import structlog

from epp.datalayer.api import Endpoint
from epp.datastore.store import Datastore
from epp.director.after_reply import AfterReply, after_reply_only
from epp.director.api import AGENT_IDENTITY, Admitter, DataProducer
from epp.director.candidates import locate, usable
from epp.director.context import RequestContext, RoutingDecision
from epp.director.dag import producer_timeout
from epp.director.lifecycle import RequestLifecycle
from epp.director.observer import NOT_OBSERVED, ActiveObserver, StageObserver, commit
from epp.director.pipeline import Pipeline
from epp.director.request_ids import RequestIds
from epp.director.response import ResponseSide, plugin_timer
from epp.director.traced import traced_scheduler
from epp.errors import BadRequest, EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.explain.record import Decision, breakdown, header_value, primary_trace
from epp.metrics import series
from epp.parsers.registry import ParserRegistry
from epp.plugin.state import CycleState
from epp.request import (
    FAIRNESS_HEADER,
    HEADER_ALIASES,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    InferenceRequest,
    RequestBody,
    control_header,
)
from epp.scheduling.api import PROFILE_TRACES, SchedulingResult
from epp.tracing import spans

# Pipeline lives in pipeline.py (the response side needs it too); callers import it from here.
__all__ = ["Director", "Pipeline", "RequestLifecycle"]

log = structlog.get_logger(__name__)

REQUEST_ID_HEADER: Final = "x-request-id"
DEFAULT_FAIRNESS_ID: Final = "default-flow"
# A producer's plain call (``ImmediateProducer.prepare_request_data_now``).
_Immediate = Callable[[CycleState, InferenceRequest, Sequence[Endpoint]], None]
_AdmitNow = Callable[[InferenceRequest, Sequence[Endpoint]], bool]
_SERIES_MAX: Final = 4096  # (incoming, target, priority) label sets whose metric children are kept
# Every name of the control headers ``start`` reads: a request with none of them (most) skips
# the three alias lookups.
_START_CONTROL_NAMES: Final = frozenset(
    name for key in (OBJECTIVE_HEADER, FAIRNESS_HEADER, MODEL_REWRITE_HEADER) for name in HEADER_ALIASES[key]
)


class Director:
    """Runs one pipeline for each request it starts.

    Per-request state lives in each request's ``RequestContext``; what a director keeps
    between requests is its RNG (weighted model rewrites, the pick for a request without a
    body), the count of requests started and closed on its pipeline (``in_flight``, kept by
    its ``ResponseSide``), and after a live config reload the director that replaced it.

    ``swap`` puts a new pipeline in place between requests: new requests start on it, and
    each ``RequestLifecycle`` keeps the director (pipeline and response side) it started with
    until it closes.

    ``after_reply`` (shared by the directors a swap makes) holds the work that may run after a
    reply is written (director.after_reply): the edge that serves ext_proc enables it.
    """

    def __init__(
        self,
        datastore: Datastore,
        pipeline: Pipeline,
        *,
        rng: random.Random | None = None,
        after_reply: AfterReply | None = None,
    ) -> None:
        self._datastore = datastore
        self._pipeline = pipeline
        self._rng = rng or random.Random()
        self._ids = RequestIds()
        self.after_reply = after_reply if after_reply is not None else AfterReply()
        self._pre_request_timers = tuple((p, plugin_timer("PreRequest", p)) for p in pipeline.pre_request)
        # Every pre-request hook only records (``AFTER_REPLY``): they and the request's metrics may
        # run once the routing reply is written.
        self._pre_request_later = after_reply_only(pipeline.pre_request)
        self._request_header_timers = tuple(
            (p, plugin_timer("RequestHeader", p)) for p in pipeline.request_header
        )
        self._screener_timers = tuple((p, plugin_timer("Screener", p)) for p in pipeline.screeners)
        # Each producer with the timeout it declares (0: none, it runs on the shared budget).
        self._producers = tuple((p, producer_timeout(p, 0.0)) for p in pipeline.producers)
        # Each producer's position, the producer and its plain call when it offers one
        # (``ImmediateProducer``), else None: what ``_prepare_data`` steps through, made once
        # (an ``enumerate`` per request costs ~2k instructions).
        self._steps: tuple[tuple[int, DataProducer, _Immediate | None], ...] = tuple(
            (i, p, getattr(p, "prepare_request_data_now", None)) for i, p in enumerate(pipeline.producers)
        )
        # ``ImmediateAdmission.admit_now`` when the admission controller offers it (no coroutine).
        self._admit_now: _AdmitNow | None = getattr(pipeline.admission, "admit_now", None)
        self._admission_tracks: bool = getattr(pipeline.admission, "TRACKS", True)
        self._traced_scheduler = traced_scheduler(pipeline.scheduler)  # sampled requests: span per profile
        self.responses = ResponseSide(datastore, pipeline, self.after_reply)
        # Whether any request may be explained: the one test a request that is not pays.
        self._explaining = bool(
            pipeline.emit_endpoint_scores or pipeline.explain_header or pipeline.decisions is not None
        )
        self._explain_header = pipeline.explain_header.lower()
        # The director a swap put in place (new requests start there); None until one does.
        self._replaced_by: Director | None = None
        # GIE's request count and size series per (incoming model, target model, priority), each
        # bound when a request first observes it: a label lookup costs ~2-4k instructions.
        self._request_series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline new requests start on."""
        return self.current._pipeline

    @property
    def current(self) -> Director:
        """The director new requests start on (``self`` until the first ``swap``)."""
        return self._replaced_by or self

    def swap(self, pipeline: Pipeline) -> Director:
        """New requests run ``pipeline`` from now on; returns the director they start on.

        One assignment: every request either started before it (and finishes on the
        pipeline it started with) or after it.  ``in_flight`` of the returned director of
        the previous swap tells when the old pipeline is no longer used.
        """
        replacement = Director(self._datastore, pipeline, rng=self._rng, after_reply=self.after_reply)
        self._replaced_by = replacement
        return replacement

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
            request_id = self._ids.new()
            headers[REQUEST_ID_HEADER] = request_id
        if headers.keys().isdisjoint(_START_CONTROL_NAMES):  # the usual request: one C-level test
            objective, fairness_id, target_model = "", DEFAULT_FAIRNESS_ID, ""
        else:
            objective = control_header(headers, OBJECTIVE_HEADER) or ""
            fairness_id = control_header(headers, FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID
            target_model = control_header(headers, MODEL_REWRITE_HEADER) or ""
        req = InferenceRequest.received(
            request_id, headers, metadata, time.monotonic(), objective, fairness_id, target_model
        )
        ctx = RequestContext.started(req, generated)
        director = self._replaced_by or self
        if director._explaining:  # the pipeline the request starts on decides
            director._start_explaining(ctx, headers)
        responses = director.responses
        responses.opened += 1
        return RequestLifecycle(director, responses, ctx, can_hold_response)  # positional: see its __init__

    def _start_explaining(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        """Decide whether the scheduler keeps traces for this request, and start its record."""
        pipeline = self._pipeline
        req = ctx.request
        if self._explain_header:
            value = headers.get(self._explain_header, "")
            ctx.explain_asked = bool(value) and value.lower() not in ("0", "false", "no", "off")
        req.explain = pipeline.emit_endpoint_scores or ctx.explain_asked or pipeline.decisions is not None
        if pipeline.decisions is not None:
            ctx.record = Decision(req.request_id, time.time())

    def commit(self, ctx: RequestContext, error: BaseException | None) -> None:
        """Put the request's decision (if one is being recorded) into the ring; once per request."""
        ring = self._pipeline.decisions
        if ring is not None:
            commit(ring, ctx, error)

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
        endpoints = self._datastore.endpoints()
        if not endpoints:
            raise Internal("no pods available in datastore")
        candidates = locate(endpoints, ctx.request.metadata, subset_filter=self._pipeline.subset_filter)
        if not candidates:
            raise ServiceUnavailable(
                "failed to find endpoint candidates for serving the request", reason="rejected-subset-empty"
            )
        candidates = usable(candidates, time.monotonic(), 0.0)  # available (no freshness step here)
        try:
            result = self._pipeline.scheduler.schedule(ctx.state, ctx.request, candidates)
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

        Called by ``RequestLifecycle.route``.  Parse (model rewrite, priority), then admission;
        the rest runs in ``_route_admitted``.  ``observer`` notes each stage of a sampled or
        recorded request; any other request is not ``observed`` and nothing is noted.
        """
        after = self.after_reply
        if after.queue:  # what earlier requests' replies left to do counts before this one routes
            after.run()
        pipeline = self._pipeline
        req = ctx.request
        observer = NOT_OBSERVED if ctx.stages is None and ctx.record is None else self._observe(ctx)
        observed = observer.active
        req.request_size_bytes = len(body)
        try:
            if observed:
                observer.begin(spans.STAGE_PARSE)
            parsed, changed, rewrite = self._parse(ctx, body)
            if self._request_header_timers:  # empty unless configured: the plain path pays one test
                self._request_header(ctx)
            if observed:
                observer.parsed(req, len(body), rewrite)

            snapshot = self._datastore.endpoints()
            candidates = locate(snapshot, req.metadata, subset_filter=pipeline.subset_filter)
            if observed:
                observer.begin(spans.STAGE_ADMISSION)
            # Before the empty check: flow control waits.  Most admit at once, without a coroutine.
            admit_now = self._admit_now
            waited: Sequence[Endpoint] | None = None  # the pool as read before a wait, if any
            if admit_now is None or not admit_now(req, candidates):
                await pipeline.admission.admit(req, candidates)
                waited = snapshot
            if observed:
                observer.admitted(candidates)
            if not self._admission_tracks:
                return await self._route_admitted(ctx, observer, body, parsed, changed, candidates, waited)
            # Until its pre-request hooks count it on its endpoint, the admitted request is in
            # transit: flow control counts it against the pool, so a burst does not pass whole.
            try:
                return await self._route_admitted(ctx, observer, body, parsed, changed, candidates, waited)
            finally:
                pipeline.admission.placed(req, scheduled=ctx.result is not None)
        except BaseException as e:
            if observed:
                observer.failed(e)
            raise

    def _request_header(self, ctx: RequestContext) -> None:
        """Run the request-header plugins in config order, then settle the fairness id.

        As llm-d-router's director: an explicit fairness header always wins; without one, an
        agent identity a plugin published becomes the fairness id, so flow control queues every
        turn of an agent session together.  A failing plugin fails the request (upstream
        returns its error).
        """
        req = ctx.request
        state = ctx.state
        for plugin, timer in self._request_header_timers:
            started = time.perf_counter()
            try:
                plugin.request_header(state, req)
            except EppError:
                raise
            except Exception as e:
                raise Internal(f"request header plugin {plugin.typed_name} failed: {e}") from e
            timer.observe(time.perf_counter() - started)
        if not control_header(req.headers, FAIRNESS_HEADER):
            identity = state.get(AGENT_IDENTITY)
            if identity:
                req.fairness_id = identity

    def _screen(
        self, state: CycleState, req: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        """Run the screeners on the same candidates and keep what every one of them kept.

        As llm-d-router's ``runScreeners``: each screener sees the located candidates (a tuple,
        so one cannot change what the next sees), the result is the intersection in candidate
        order, and an empty one is a 503 with the no-endpoints reason.  ``pool`` is the
        datastore's endpoints, for screeners that count the whole pool (rollout coverage).
        """
        seen = tuple(candidates)
        pool = self._datastore.endpoints()
        kept = seen
        for plugin, timer in self._screener_timers:
            started = time.perf_counter()
            allowed = set(plugin.screen(state, req, seen, pool))  # an endpoint's identity is the object
            timer.observe(time.perf_counter() - started)
            kept = tuple(ep for ep in kept if ep in allowed)
        if not kept:
            raise ServiceUnavailable(
                "screeners eliminated all endpoint candidates", reason="rejected-no-endpoints"
            )
        return kept

    def _observe(self, ctx: RequestContext) -> ActiveObserver:
        """The observer of a sampled or recorded request (a sampled one runs the traced scheduler)."""
        scheduler = self._pipeline.scheduler if ctx.stages is None else self._traced_scheduler
        return ActiveObserver(ctx.stages, ctx.record, scheduler)

    async def _route_admitted(
        self,
        ctx: RequestContext,
        observer: StageObserver,
        body: bytes,
        parsed: RequestBody,
        changed: bool,
        candidates: Sequence[Endpoint],
        waited: Sequence[Endpoint] | None,
    ) -> RoutingDecision:
        """After admission: candidates, data producers, admit plugins, scheduler, pre-request hooks."""
        pipeline = self._pipeline
        req = ctx.request
        state = ctx.state
        observed = observer.active
        if waited is not None:  # it waited in admission: what ran meanwhile may have left work
            after = self.after_reply
            if after.queue:
                after.run()
            # The pool changed while the request waited.
            if self._datastore.endpoints() is not waited:
                candidates = locate(
                    self._datastore.endpoints(), req.metadata, subset_filter=pipeline.subset_filter
                )
        # Fresh metrics (when a staleness threshold is set), then not a crashed or failing replica.
        candidates = usable(candidates, time.monotonic(), pipeline.staleness_threshold)
        if observed:
            observer.saw(candidates)
        if not candidates:
            raise ServiceUnavailable(
                "failed to find endpoint candidates for serving the request",
                reason="rejected-subset-empty" if self._datastore.endpoints() else "rejected-no-endpoints",
            )
        if self._screener_timers:  # empty unless configured: the plain path pays one test
            candidates = self._screen(state, req, candidates)

        if pipeline.producers:
            if observed:
                observer.begin(spans.STAGE_PRODUCERS)
            waiting = self._prepare_data(state, req, candidates)
            if waiting is not None:  # a producer waits: it and those after it run under the timer
                await waiting
            if observed:
                observer.produced(pipeline.producers, candidates)
        if pipeline.admitters:
            if observed:
                observer.admitting(pipeline.admitters)
            for admitter in pipeline.admitters:
                reason = admitter.admit_request(state, req, candidates)
                if reason is not None:
                    self._denied(observer, admitter, reason, req)
            if observed:
                observer.plugins_admitted()

        try:
            if observed:
                result = observer.schedule(state, req, candidates)
            else:
                result = pipeline.scheduler.schedule(state, req, candidates)
            targets = result.primary.target_endpoints
        except EppError:
            raise
        except Exception as e:  # SchedulingError and any plugin failure: GIE answers 429
            raise ResourceExhausted(
                f"failed to find target endpoint: {e}", reason="rejected-no-candidates"
            ) from e
        if observed:
            observer.scheduled()
        if not targets:
            raise Internal("results must be greater than zero")
        # From here on the request counts as scheduled: if a pre-request hook or the body
        # repackaging fails, closing the lifecycle still runs the completion hooks that
        # release what the pre-request hooks took (in-flight counters).
        ctx.result = result
        ctx.target = targets[0]

        if observed:
            observer.begin(spans.STAGE_PICK)
        # Hooks that only record wait for the routing reply (the lifecycle queues them once
        # routing succeeded); the others run here, before it, as they may change it.
        later = self._pre_request_later and self.after_reply.enabled and not observed
        if not later:
            self.pre_request(state, req, result, len(body))
        try:
            out = ctx.parser.serialize_request(parsed) if changed and ctx.parser is not None else body
            # ``metadata.hostport``: ``Endpoint.hostport`` is a property, a call
            destination = (
                targets[0].metadata.hostport if len(targets) == 1 else ",".join(t.hostport for t in targets)
            )
            if observed:
                observer.picked(result, targets, destination)
            decision = self._decision(ctx, result, destination, out, out is not body)
        except BaseException:
            if later:  # as inline: the hooks counted it, and closing the request releases it
                self.pre_request(state, req, result, len(body))
            raise
        ctx.hooks_later = later
        return decision

    def pre_request(
        self, state: CycleState, req: InferenceRequest, result: SchedulingResult, size: int
    ) -> None:
        """The pre-request hooks in config order, then the request's count and size metrics.

        Run while routing, or (``ctx.hooks_later``: every hook only records) by the request's
        lifecycle once the routing reply is written (``RequestLifecycle.run_later``).
        """
        for plugin, timer in self._pre_request_timers:
            started = time.perf_counter()
            plugin.pre_request(state, req, result)
            timer.observe(time.perf_counter() - started)
        count, sizes = self._request_series.get(
            (req.incoming_model, req.target_model, req.priority)
        ) or self._bind_request_series(req)
        count.inc()
        sizes.observe(size)

    def _bind_request_series(self, req: InferenceRequest) -> tuple[Any, Any]:
        """The request total and request size children for ``req``'s labels, kept for the next request."""
        kept = self._request_series
        if len(kept) >= _SERIES_MAX:  # models are named by clients: a bound, then it starts again
            kept.clear()
        bound = kept[req.incoming_model, req.target_model, req.priority] = (
            series.REQUEST_TOTAL.labels(req.incoming_model, req.target_model, str(req.priority)),
            series.REQUEST_SIZES.labels(req.incoming_model, req.target_model),
        )
        return bound

    def _denied(
        self, observer: StageObserver, admitter: Admitter, reason: str, req: InferenceRequest
    ) -> NoReturn:
        """An admit plugin refused the request: log it and reject (GIE answers 500)."""
        log.info("request_denied", plugin=str(admitter.typed_name), reason=reason, request_id=req.request_id)
        if observer.active:
            observer.denied(admitter, reason)
        raise Internal("request cannot be admitted", reason="rejected-admission")

    def _decision(
        self, ctx: RequestContext, result: SchedulingResult, destination: str, out: bytes, changed: bool
    ) -> RoutingDecision:
        """What the edge tells Envoy; an explained request also gets its scores and breakdown."""
        headers: tuple[tuple[str, str], ...] = (
            ((REQUEST_ID_HEADER, ctx.request.request_id),) if ctx.generated_request_id else ()
        )
        remove: tuple[str, ...] = ()
        mutation = ctx.request.header_mutation  # None unless a pre-request plugin (P/D) asked for one
        if mutation is not None:
            headers = (*headers, *mutation.set.items())
            remove = tuple(mutation.remove)
        if not (self._pipeline.emit_endpoint_scores or ctx.explain_asked):
            return RoutingDecision.plain(destination, out, changed, headers, remove)
        scored = result.primary.scored
        traces = ctx.state.get(PROFILE_TRACES)
        trace = primary_trace(traces, result.primary_profile_name) if traces else None
        if trace is not None and ctx.explain_asked:
            ctx.explain_header = header_value(trace)
        return RoutingDecision(
            destination=destination,
            body=out,
            body_changed=changed,
            headers=headers,
            scores={ep.hostport: round(score, 6) for ep, score in scored} if scored else None,
            remove_headers=remove,
            breakdown=breakdown(trace) if trace is not None else None,
        )

    def _parse(self, ctx: RequestContext, body: bytes) -> tuple[RequestBody, bool, str]:
        """Parse, rewrite the model, take the objective's priority: (parsed body, body changed, rewrite)."""
        req = ctx.request
        configured = self._pipeline.parser
        # Several parsers: the one claiming this path (BadRequest when none does).
        parser = configured.resolve(req.headers) if isinstance(configured, ParserRegistry) else configured
        ctx.parser = parser
        parsed = parser.parse_request(body, req.headers)
        req.body = parsed
        changed = False
        rewrite = ""
        doc = parsed.json
        if doc is not None:
            incoming = doc.get("model")  # ``parsed.model`` written out: a property, a call
            if not incoming or not isinstance(incoming, str):
                raise BadRequest("model not found in request body")
            req.incoming_model = incoming
            target = req.target_model or incoming
            rewrites = self._datastore.rewrites
            decision = rewrites.decide(incoming, self._rng) if rewrites.applies else None
            if decision is not None:
                target = decision.target_model
                rewrite = decision.rewrite_name
                series.MODEL_REWRITE_DECISIONS_TOTAL.labels(decision.rewrite_name, incoming, target).inc()
            req.target_model = target
            if target != incoming:
                doc["model"] = target
                changed = True
                ctx.rewrite_response_model = True
        else:
            req.target_model = ""
        if req.objective:
            obj = self._datastore.objective(req.objective)
            if obj is not None:
                req.priority = obj.priority
        return parsed, changed, rewrite

    def _prepare_data(
        self, state: CycleState, req: InferenceRequest, eps: Sequence[Endpoint]
    ) -> Coroutine[Any, Any, None] | None:
        """Run producers in DAG order (``_prepare_timed``), arming the timer only once one waits.

        Producers almost never wait (they read the cycle state, the datastore, an in-process
        index), and an ``asyncio.timeout`` costs a Timeout and a loop timer armed and cancelled
        per request (~6 µs, more than most producers).  So each producer is stepped at once;
        the first one that waits continues, with those after it, under the timer: the coroutine
        returned, which the caller awaits at once.  None: every producer finished here (a plain
        call, not a coroutine of its own: one less a request).  A timeout can only fire while a
        producer waits, so the producers that never wait lose nothing.
        """
        for i, producer, now in self._steps:
            if now is not None:  # never waits: a plain call, no coroutine
                try:
                    now(state, req, eps)
                except Exception:
                    _producer_failed(producer, req)
                continue
            coro = producer.prepare_request_data(state, req, eps)
            try:
                yielded = coro.send(None)
            except StopIteration:
                continue
            except Exception:
                _producer_failed(producer, req)
                continue
            return self._prepare_timed(state, req, eps, i, _resume(coro, yielded))
        return None

    async def _prepare_timed(
        self,
        state: CycleState,
        req: InferenceRequest,
        eps: Sequence[Endpoint],
        first: int = 0,
        waiting: Awaitable[None] | None = None,
    ) -> None:
        """Run producers from ``first`` in DAG order; a failure is logged and the request goes on.

        ``waiting``: the producer ``first``, already started and waiting (``_prepare_data``).

        The producers that declare no timeout share the pipeline's budget (0.4 s); one that
        declares its own (``TimeoutAwareProducer``: a burst window, a render call) runs under it,
        and its time is not charged to the budget.  One timer a request: its deadline moves
        around a declared producer.  A timeout ends production, as upstream's first failing
        producer does; a producer that raises does not (each runs, and consumers of missing data
        see no attribute, which scorers treat as no signal).
        """
        loop = asyncio.get_running_loop()
        budget = self._pipeline.producer_timeout
        running = None
        try:
            async with asyncio.timeout(budget) as deadline:
                for producer, declared in self._producers[first:]:
                    running = producer
                    if not declared:
                        await self._produce(producer, state, req, eps, waiting)
                        waiting = None
                        continue
                    started = loop.time()
                    left = (deadline.when() or started) - started
                    deadline.reschedule(started + declared)
                    await self._produce(producer, state, req, eps, waiting)
                    waiting = None
                    deadline.reschedule(loop.time() + left)
        except TimeoutError:
            log.warning(
                "prepare_data_timed_out",
                plugin=str(running.typed_name) if running is not None else "",
                request_id=req.request_id,
            )

    @staticmethod
    async def _produce(
        producer: DataProducer,
        state: CycleState,
        req: InferenceRequest,
        eps: Sequence[Endpoint],
        waiting: Awaitable[None] | None = None,
    ) -> None:
        """Run ``producer`` (or await ``waiting``, its run already started); log a failure."""
        try:
            await (waiting if waiting is not None else producer.prepare_request_data(state, req, eps))
        except Exception:  # not the timeout's cancellation: that is a BaseException
            _producer_failed(producer, req)


def _producer_failed(producer: DataProducer, req: InferenceRequest) -> None:
    """In an ``except``: log a producer's failure with its traceback (the request goes on)."""
    log.warning(
        "prepare_data_failed", plugin=str(producer.typed_name), request_id=req.request_id, exc_info=True
    )


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], yielded: Any) -> Generator[Any, Any, None]:
    """Continue ``coro``, which yielded ``yielded`` when stepped by hand, as the awaiting task's
    own (``epp.server.h2.eager`` does the same for a whole route)."""
    while True:
        try:
            sent = yield yielded
        except BaseException as e:  # the task's cancellation (the timeout), or a thrown exception
            try:
                yielded = coro.throw(e)
            except StopIteration:
                return
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return
