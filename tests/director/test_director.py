"""The director pipeline with small fake plugins: order, errors, rewrites, hooks and metrics."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit, LegacyAdmission
from epp.datalayer.api import Endpoint
from epp.datastore.rewrites import ModelRewrite, RewriteRule, RewriteTarget
from epp.datastore.store import Datastore, Objective
from epp.director.director import Director, Pipeline
from epp.director.lifecycle import Phase
from epp.director.response import rewrite_model_name
from epp.errors import BadRequest, EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.metrics.series import REGISTRY
from epp.plugin.base import TypedName
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest, RequestBody, ResponseInfo, Usage
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.builders import make_endpoint

LOG: list[str] = []
KEY = AttributeKey("test-key", int)


class JsonParser:
    TYPE: ClassVar[str] = "json"
    typed_name = TypedName("json", "json")

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"error unmarshaling request bodyMap: {e}") from None
        return RequestBody(api=ApiKind.COMPLETIONS, raw=body, json=data)

    def serialize_request(self, body: RequestBody) -> bytes:
        return orjson.dumps(body.json)

    def usage_parser(self, headers: Mapping[str, str]) -> Any:
        class P:
            def feed(self, chunk: bytes, eos: bool) -> Usage | None:
                return Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17) if eos else None

        return P()


class LowestQueue:
    """Picks the lowest queue; ``n`` targets; raises when asked to."""

    def __init__(self, n: int = 1, fail: Exception | None = None) -> None:
        self.n = n
        self.fail = fail
        self.seen: list[InferenceRequest] = []

    def schedule(
        self, state: CycleState, request: InferenceRequest, cands: Sequence[Endpoint]
    ) -> SchedulingResult:
        LOG.append("schedule")
        self.seen.append(request)
        if self.fail is not None:
            raise self.fail
        ranked = sorted(cands, key=lambda e: e.metrics.waiting_queue_size)
        return SchedulingResult({"default": ProfileRunResult(tuple(ranked[: self.n]))}, "default")


class Producer:
    TYPE: ClassVar[str] = "producer"
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({KEY})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()

    def __init__(self, name: str, behaviour: str = "ok") -> None:
        self.typed_name = TypedName("producer", name)
        self.behaviour = behaviour

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> None:
        LOG.append(f"produce:{self.typed_name.name}")
        if self.behaviour == "fail":
            raise RuntimeError("boom")
        if self.behaviour == "hang":
            await asyncio.sleep(3600)  # the producer hangs: part of the scenario
        for ep in eps:
            state.put_attribute(KEY, ep, 1)


class Hooks:
    """Records every hook it is called for."""

    TYPE: ClassVar[str] = "hooks"
    typed_name = TypedName("hooks", "hooks")

    def __init__(self, deny: str | None = None) -> None:
        self.deny = deny
        self.completions: list[ResponseInfo] = []

    def admit_request(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> str | None:
        LOG.append("admit")
        return self.deny

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        LOG.append("pre_request")

    def response_header(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        resp.headers["x-added-by-plugin"] = "yes"

    def response_complete(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        self.completions.append(resp)
        resp.dynamic_metadata["envoy.lb"] = {"x-gateway-inference-request-cost": 10}


def director(
    *,
    scheduler: LowestQueue | None = None,
    producers: tuple[Producer, ...] = (),
    hooks: Hooks | None = None,
    admission: Any = None,
    eps: Sequence[Endpoint] | None = None,
    timeout: float = 0.4,
) -> tuple[Director, Datastore]:
    ds = Datastore()
    for ep in (
        eps
        if eps is not None
        else [make_endpoint(0, queue=3), make_endpoint(1, queue=0), make_endpoint(2, queue=10)]
    ):
        ds._endpoints[ep.name] = ep
    ds._snapshot = tuple(ds._endpoints.values())
    h = (hooks,) if hooks else ()
    pipe = Pipeline(
        parser=JsonParser(),  # type: ignore[arg-type]
        scheduler=scheduler or LowestQueue(),
        admission=admission or AlwaysAdmit(),
        producers=producers,  # type: ignore[arg-type]
        admitters=h,  # type: ignore[arg-type]
        pre_request=h,  # type: ignore[arg-type]
        response_header=h,  # type: ignore[arg-type]
        response_complete=h,  # type: ignore[arg-type]
        producer_timeout=timeout,
    )
    return Director(ds, pipe, rng=random.Random(0)), ds


def body(model: str = "my-model", **extra: Any) -> bytes:
    return orjson.dumps({"model": model, "prompt": "hi", **extra})


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def _clear_log() -> None:
    LOG.clear()


async def test_routes_to_scheduler_choice_and_counts_request() -> None:
    """The primary target becomes the destination; request_total counts model, target and priority."""
    d, ds = director()
    ds.set_objectives([Objective(name="gold", priority=2)])
    before = metric(
        "inference_objective_request_total", model_name="m1", target_model_name="m1", priority="2"
    )
    lc = d.start({"x-gateway-inference-objective": "gold", "x-request-id": "r1"}, {})
    decision = await lc.route(body("m1"))
    assert decision.destination == "192.168.1.2:8000"
    assert decision.body_changed is False
    assert lc.request.priority == 2
    after = metric("inference_objective_request_total", model_name="m1", target_model_name="m1", priority="2")
    assert after == before + 1


async def test_request_series_are_kept_per_labels_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request counts in its own (model, target, priority) series, also when the director's
    kept children start again after ``_SERIES_MAX`` label sets (here 1)."""
    monkeypatch.setattr("epp.director.director._SERIES_MAX", 1)
    d, ds = director()
    ds.set_objectives([Objective(name="gold", priority=2)])

    def counts() -> tuple[float, float, float]:
        gold = metric(
            "inference_objective_request_total", model_name="m1", target_model_name="m1", priority="2"
        )
        plain = metric(
            "inference_objective_request_total", model_name="m1", target_model_name="m1", priority="0"
        )
        sizes = metric("inference_objective_request_sizes_count", model_name="m1", target_model_name="m1")
        return gold, plain, sizes

    gold, plain, sizes = counts()
    for headers in (
        {"x-gateway-inference-objective": "gold"},
        {},
        {},
        {"x-gateway-inference-objective": "gold"},
    ):
        await d.start(dict(headers), {}).route(body("m1"))
    assert counts() == (gold + 2, plain + 2, sizes + 4)


async def test_fallbacks_are_comma_joined_primary_first() -> None:
    """With several targets the destination lists them in order."""
    d, _ = director(scheduler=LowestQueue(n=3))
    decision = await d.start({}, {}).route(body())
    assert decision.destination == "192.168.1.2:8000,192.168.1.1:8000,192.168.1.3:8000"


async def test_header_rewrite_changes_body_and_response_model() -> None:
    """x-gateway-model-name-rewrite sets the target; the response shows the client's name again."""
    d, _ = director()
    lc = d.start({"x-gateway-model-name-rewrite": "target-x"}, {})
    decision = await lc.route(body("client-m"))
    assert decision.body_changed and decision.body is not None
    assert orjson.loads(decision.body)["model"] == "target-x"
    assert lc.request.incoming_model == "client-m" and lc.request.target_model == "target-x"
    lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
    out = lc.response_chunk(b'{"model":"target-x","x":1}', True)
    assert out == b'{"model":"client-m","x":1}'


async def test_rewrite_rule_overrides_header_and_is_counted() -> None:
    """An InferenceModelRewrite rule wins over the header and bumps the decision counter."""
    d, ds = director()
    rule = RewriteRule(matches=("m",), targets=(RewriteTarget(model="m-v2", weight=1),))
    ds.rewrites.set_all([ModelRewrite(name="rw", rules=(rule,))])
    before = metric(
        "inference_extension_model_rewrite_decisions_total",
        model_rewrite_name="rw",
        model_name="m",
        target_model="m-v2",
    )
    lc = d.start({"x-gateway-model-name-rewrite": "ignored"}, {})
    await lc.route(body("m"))
    assert lc.request.target_model == "m-v2"
    assert (
        metric(
            "inference_extension_model_rewrite_decisions_total",
            model_rewrite_name="rw",
            model_name="m",
            target_model="m-v2",
        )
        == before + 1
    )


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        pytest.param(
            b'{"prompt":"hello world"}', BadRequest, "model not found in request body", id="no-model"
        ),
        pytest.param(b"no healthy upstream", BadRequest, "error unmarshaling request bodyMap", id="bad-json"),
    ],
)
async def test_bad_bodies(raw: bytes, error: type[EppError], message: str) -> None:
    """Bodies the parser or the director cannot serve are 400s with GIE's message."""
    d, _ = director()
    with pytest.raises(error, match=message):
        await d.start({}, {}).route(raw)


async def test_no_candidates_is_503() -> None:
    """An empty subset hint leaves no candidate: ServiceUnavailable."""
    d, _ = director()
    md: dict[str, Any] = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": []}}
    with pytest.raises(ServiceUnavailable, match="failed to find endpoint candidates"):
        await d.start({}, md).route(body())


async def test_scheduling_failure_is_429() -> None:
    """A scheduler error becomes ResourceExhausted 'failed to find target endpoint: ...'."""
    d, _ = director(scheduler=LowestQueue(fail=RuntimeError("no endpoints available for the given request")))
    with pytest.raises(ResourceExhausted, match="failed to find target endpoint: no endpoints available"):
        await d.start({}, {}).route(body())


async def test_admitter_denial_is_500_and_skips_scheduling() -> None:
    """An AdmitRequest plugin's denial is GIE's 500 'request cannot be admitted'."""
    d, _ = director(hooks=Hooks(deny="too slow"))
    with pytest.raises(Internal, match="request cannot be admitted"):
        await d.start({}, {}).route(body())
    assert "schedule" not in LOG


class RecordingAdmission(AlwaysAdmit):
    """Admits everything and records what the director reports once each request is placed."""

    __slots__ = ("reports",)

    TRACKS: ClassVar[bool] = True  # it keeps reports: the director calls ``placed``

    def __init__(self) -> None:
        self.reports: list[tuple[str, bool, list[str]]] = []

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        self.reports.append((request.request_id, scheduled, list(LOG)))


@pytest.mark.parametrize(
    ("make", "error", "scheduled"),
    [
        pytest.param(lambda a: director(admission=a, hooks=Hooks()), None, True, id="scheduled"),
        pytest.param(
            lambda a: director(admission=a, scheduler=LowestQueue(fail=RuntimeError("none"))),
            ResourceExhausted,
            False,
            id="scheduling-failed",
        ),
        pytest.param(
            lambda a: director(admission=a, hooks=Hooks(deny="no")), Internal, False, id="admitter-denied"
        ),
        pytest.param(lambda a: director(admission=a, eps=[]), ServiceUnavailable, False, id="no-candidates"),
    ],
)
async def test_admission_hears_once_that_each_admitted_request_was_placed(
    make: Any, error: type[EppError] | None, scheduled: bool
) -> None:
    """Flow control counts an admitted request as in transit until this report: exactly one per
    request, after the pre-request hooks (which count it on its endpoint) or after a failure."""
    admission = RecordingAdmission()
    d, _ = make(admission)
    lifecycle = d.start({"x-request-id": "req-1"}, {})
    if error is None:
        await lifecycle.route(body())
    else:
        with pytest.raises(error):
            await lifecycle.route(body())
    assert [(rid, ok) for rid, ok, _ in admission.reports] == [("req-1", scheduled)]
    if scheduled:
        assert admission.reports[0][2][-1] == "pre_request"


async def test_order_of_stages() -> None:
    """Producers run before admit plugins, which run before the scheduler and pre-request."""
    d, _ = director(producers=(Producer("a"), Producer("b")), hooks=Hooks())
    await d.start({}, {}).route(body())
    assert LOG == ["produce:a", "produce:b", "admit", "schedule", "pre_request"]


async def test_failing_producer_does_not_stop_the_request() -> None:
    """A producer that raises is logged; later producers still run and the request is routed."""
    d, _ = director(producers=(Producer("bad", "fail"), Producer("good")))
    decision = await d.start({}, {}).route(body())
    assert decision.destination
    assert LOG[:2] == ["produce:bad", "produce:good"]


async def test_producers_share_one_timeout() -> None:
    """A hanging producer is cut off by the default timeout and the request still routes."""
    d, _ = director(producers=(Producer("slow", "hang"),), timeout=0.05)
    decision = await d.start({}, {}).route(body())
    assert decision.destination == "192.168.1.2:8000"


class SlowProducer(Producer):
    """Takes ``delay`` seconds (a producer that waits by design, e.g. a burst window); declares
    ``own`` as its timeout (upstream's TimeoutAwareProducer) when given."""

    def __init__(self, name: str, delay: float, own: float | None = None) -> None:
        super().__init__(name)
        self.delay, self.own = delay, own
        if own is not None:
            self.produce_timeout = lambda: own

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> None:
        await asyncio.sleep(self.delay)  # the producer's own work takes this long: the scenario
        LOG.append(f"done:{self.typed_name.name}")


async def test_a_producer_declaring_a_long_timeout_is_waited_for_one_without_is_cut() -> None:
    """A producer declaring a timeout runs past the budget under its own; one declaring none (or
    <= 0) is cut at the budget, which ends production (upstream's first failing producer)."""
    d, _ = director(
        producers=(
            SlowProducer("windowed", delay=0.15, own=5.0),  # 3x the budget, within its own
            SlowProducer("zero-declared", delay=3600, own=0.0),  # <= 0: the budget applies
            Producer("after"),
        ),
        timeout=0.05,
    )
    decision = await d.start({}, {}).route(body())
    assert decision.destination
    assert [e for e in LOG if e.startswith(("done:", "produce:"))] == ["done:windowed"]


async def test_a_declared_producer_s_time_is_not_charged_to_the_shared_budget() -> None:
    d, _ = director(
        producers=(
            SlowProducer("before", delay=0.03),
            SlowProducer("windowed", delay=0.4, own=5.0),  # twice the budget on its own
            SlowProducer("after", delay=0.03),  # 0.06 s of the 0.2 s budget spent in all
        ),
        timeout=0.2,
    )
    await d.start({}, {}).route(body())
    assert [e for e in LOG if e.startswith("done:")] == ["done:before", "done:windowed", "done:after"]


async def test_producers_that_do_not_wait_run_at_once_and_the_first_that_waits_is_timed() -> None:
    """Producers are stepped at once; the timer starts with the first that waits, which is cut
    at the budget with the ones after it, while those before it (even a failing one) ran."""
    d, _ = director(
        producers=(Producer("quick"), Producer("bad", "fail"), Producer("slow", "hang"), Producer("after")),
        timeout=0.05,
    )
    decision = await d.start({}, {}).route(body())
    assert decision.destination
    assert [e for e in LOG if e.startswith("produce:")] == ["produce:quick", "produce:bad", "produce:slow"]


async def test_a_producer_that_waits_then_fails_is_logged_and_the_next_runs() -> None:
    class WaitThenFail(Producer):
        async def prepare_request_data(
            self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
        ) -> None:
            await asyncio.sleep(0)
            LOG.append("waited")
            raise RuntimeError("boom after a wait")

    d, _ = director(producers=(WaitThenFail("flaky"), Producer("next")), timeout=1.0)
    assert (await d.start({}, {}).route(body())).destination
    assert [e for e in LOG if e in ("waited", "produce:next")] == ["waited", "produce:next"]


class PlainProducer(Producer):
    """Offers its work as a plain call too (``ImmediateProducer``): the coroutine must not run."""

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> None:
        raise AssertionError("the director awaited a producer that offers a plain call")

    def prepare_request_data_now(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> None:
        LOG.append(f"now:{self.typed_name.name}")
        if self.behaviour == "fail":
            raise RuntimeError("boom")
        for ep in eps:
            state.put_attribute(KEY, ep, 2)


async def test_a_producer_offering_a_plain_call_is_called_in_dag_order_and_a_failure_goes_on() -> None:
    """Plain calls and coroutines interleave in the configured order; a failing plain call is
    logged like a failing coroutine and the producers after it still run."""
    d, _ = director(
        producers=(PlainProducer("a"), Producer("b"), PlainProducer("bad", "fail"), PlainProducer("c")),
        timeout=1.0,
    )
    assert (await d.start({}, {}).route(body())).destination
    assert [e for e in LOG if e.startswith(("now:", "produce:"))] == [
        "now:a",
        "produce:b",
        "now:bad",
        "now:c",
    ]


async def test_sheddable_request_is_shed_when_saturated() -> None:
    """Legacy admission refuses priority < 0 with 429 when the detector says saturated."""

    class Full:
        typed_name = TypedName("d", "d")

        def saturation(self, eps: Sequence[Endpoint]) -> float:
            return 1.0

    d, ds = director(admission=LegacyAdmission(Full()))  # type: ignore[arg-type]
    ds.set_objectives([Objective(name="cheap", priority=-1), Objective(name="vip", priority=1)])
    with pytest.raises(ResourceExhausted, match="system saturated, sheddable request dropped"):
        await d.start({"x-gateway-inference-objective": "cheap"}, {}).route(body())
    assert (await d.start({"x-gateway-inference-objective": "vip"}, {}).route(body())).destination


async def test_header_only_request_prefers_least_loaded_and_honours_hint() -> None:
    """A GET goes through the scheduler (lowest queue) and respects the subset hint."""
    d, _ = director()
    assert d.start({}, {}).route_headers_only().destination == "192.168.1.2:8000"
    md = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["192.168.1.3:8000"]}}
    assert d.start({}, md).route_headers_only().destination == "192.168.1.3:8000"


def test_header_only_with_empty_pool_is_500() -> None:
    """No endpoint at all: GIE's 500 'no pods available in datastore'."""
    d, _ = director(eps=[])
    with pytest.raises(Internal, match="no pods available in datastore"):
        d.start({}, {}).route_headers_only()


def test_request_id_generated_when_missing() -> None:
    """A missing x-request-id is generated and forwarded upstream."""
    d, _ = director()
    lc = d.start({}, {})
    assert len(lc.request.request_id) == 36
    assert lc.route_headers_only().headers == (("x-request-id", lc.request.request_id),)


async def test_completion_runs_once_and_metrics_recorded() -> None:
    """The completion hook runs once at end of stream; tokens, running gauge and metadata follow."""
    hooks = Hooks()
    d, _ = director(hooks=hooks)
    lc = d.start({}, {})
    await lc.route(body("tok-model"))
    assert metric("inference_objective_running_requests", model_name="tok-model") == 1
    headers = {":status": "200", "content-type": "text/event-stream"}
    lc.response_headers(headers, end_of_stream=False)
    assert headers["x-added-by-plugin"] == "yes"
    lc.response_chunk(b"data: {}\n\n", False)
    lc.response_chunk(b"data: [DONE]\n\n", True)
    lc.close()
    assert len(hooks.completions) == 1
    assert hooks.completions[0].usage == Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17)
    assert lc.response_metadata
    assert metric("inference_objective_running_requests", model_name="tok-model") == 0
    assert (
        metric("inference_objective_input_tokens_sum", model_name="tok-model", target_model_name="tok-model")
        == 7
    )


async def test_abnormal_end_still_completes_and_counts_error_once() -> None:
    """A stream that dies mid-response still runs completion (releasing state); errors count once."""
    hooks = Hooks()
    d, _ = director(hooks=hooks)
    lc = d.start({}, {})
    await lc.route(body("err-model"))
    lc.response_headers({":status": "503"}, end_of_stream=False)
    lc.close()
    assert len(hooks.completions) == 1 and not hooks.completions[0].end_of_stream
    assert metric("inference_objective_running_requests", model_name="err-model") == 0
    assert (
        metric(
            "inference_objective_request_error_total",
            model_name="err-model",
            target_model_name="err-model",
            error_code="ModelServerError",
            reason="model-server-503",
        )
        == 1
    )


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        pytest.param(b'{"model":"t"}', b'{"model":"c"}', id="compact"),
        pytest.param(b'{"model": "t"}', b'{"model": "c"}', id="one-space"),
        pytest.param(b'{"model":"tt"}', b'{"model":"tt"}', id="other-model-untouched"),
    ],
)
def test_rewrite_model_name(chunk: bytes, expected: bytes) -> None:
    """GIE's byte replacement restores the client's model name in response chunks."""
    assert rewrite_model_name(chunk, "t", "c") == expected


async def test_failing_pre_request_hook_still_completes() -> None:
    """If a pre-request hook raises after another took per-request state, completion still runs."""

    class Boom(Hooks):
        def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
            raise RuntimeError("pre-request failed")

    hooks = Boom()
    d, _ = director(hooks=hooks)
    lc = d.start({}, {})
    with pytest.raises(RuntimeError):
        await lc.route(body())
    assert lc.phase is Phase.RECEIVING and lc.scheduled
    lc.close()
    assert len(hooks.completions) == 1


async def test_stale_endpoints_are_skipped_while_a_fresh_one_exists() -> None:
    """An endpoint whose last scrape aged out (dead server) stops attracting traffic; all stale → all."""
    dead = make_endpoint(0, queue=0, fresh=False)
    alive = make_endpoint(1, queue=7)
    ds = Datastore()
    ds._endpoints = {dead.name: dead, alive.name: alive}
    ds._snapshot = (dead, alive)
    pipe = Pipeline(
        parser=JsonParser(),  # type: ignore[arg-type]
        scheduler=LowestQueue(),
        admission=AlwaysAdmit(),
        staleness_threshold=2.0,
    )
    d = Director(ds, pipe)
    assert (await d.start({}, {}).route(body())).destination == alive.hostport
    alive.metrics = dead.metrics
    assert (await d.start({}, {}).route(body())).destination == dead.hostport  # fail open: lowest queue


async def test_llmd_header_names_are_read_and_win_over_gie_names() -> None:
    """llm-d-router's ``x-llm-d-*`` names steer the request; GIE's stay its deprecated aliases."""
    d, ds = director()
    ds.set_objectives([Objective(name="gold", priority=2), Objective(name="old", priority=-1)])
    lc = d.start(
        {
            "x-llm-d-inference-objective": "gold",
            "x-gateway-inference-objective": "old",
            "x-llm-d-model-name-rewrite": "target-x",
            "x-llm-d-inference-fairness-id": "tenant-a",
        },
        {},
    )
    decision = await lc.route(body("client-m"))
    assert lc.request.objective == "gold" and lc.request.priority == 2
    assert lc.request.fairness_id == "tenant-a"
    assert decision.body is not None and orjson.loads(decision.body)["model"] == "target-x"
