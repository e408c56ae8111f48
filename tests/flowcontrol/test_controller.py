"""FlowController: bands, fairness, ordering, capacity, TTL, cancellation, head-of-line, GC, lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config, load_config_file
from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.flowcontrol.api import Outcome, TransitAwareDetector
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.detectors.utilization import UtilizationDetector, UtilizationDetectorParams
from epp.flowcontrol.fairness.global_strict import GlobalStrictFairnessPolicy
from epp.flowcontrol.fairness.round_robin import RoundRobinFairnessPolicy
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.queues import HeapQueue, ListQueue
from epp.flowcontrol.usage_limits.static import StaticUsageLimitParams, StaticUsageLimitPolicy
from epp.request import InferenceRequest
from epp.testing.flowcontrol import CeilingsByPriority, FakeDetector
from epp.testing.plugins import FakeHandle
from tests.flowcontrol.helpers import (
    make_controller,
    policy_plugins,
    queue_up,
    record,
    req,
    sample,
    settings,
)
from tests.scheduling.builders import endpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "examples" / "flow-control.yaml"
QUEUE_SIZE = "inference_extension_flow_control_queue_size"
QUEUE_BYTES = "inference_extension_flow_control_queue_bytes"
QUEUE_DURATION = "inference_extension_flow_control_request_queue_duration_seconds_count"
ENQUEUE_DURATION = "inference_extension_flow_control_request_enqueue_duration_seconds_count"


def _band(policy: str, fairness: str = GlobalStrictFairnessPolicy.TYPE) -> dict[str, Any]:
    return {"defaultPriorityBand": {"orderingPolicyRef": policy, "fairnessPolicyRef": fairness}}


async def _release(
    detector: FakeDetector, controller: FlowController, tasks: list[asyncio.Task[Outcome]]
) -> None:
    """Unsaturate the pool, wake the dispatcher, and wait for every waiter."""
    detector.value = 0.0
    controller.notify()
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert set(outcomes) == {Outcome.DISPATCHED}


# --- dispatch order ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "requests", "expected"),
    [
        pytest.param(
            {},
            [req("low", priority=0), req("high", priority=10), req("mid", priority=5)],
            ["high", "mid", "low"],
            id="priority-bands-high-first",
        ),
        pytest.param(
            {},
            [req("a1", flow="a"), req("a2", flow="a"), req("b1", flow="b"), req("a3", flow="a")],
            ["a1", "a2", "b1", "a3"],
            id="global-strict-fcfs-is-one-fifo",
        ),
        pytest.param(
            _band(FcfsOrderingPolicy.TYPE, RoundRobinFairnessPolicy.TYPE),
            [req("a1", flow="a"), req("a2", flow="a"), req("a3", flow="a"), req("b1", flow="b")],
            ["a1", "b1", "a2", "a3"],
            id="round-robin-alternates-flows",
        ),
        pytest.param(
            _band(FcfsOrderingPolicy.TYPE, RoundRobinFairnessPolicy.TYPE),
            [req(f"a{i}", flow="a") for i in range(8)] + [req("b0", flow="b"), req("c0", flow="c")],
            ["a0", "b0", "c0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"],
            id="round-robin-no-starvation-of-quiet-flows",
        ),
        pytest.param(
            _band("slo-deadline-ordering-policy"),
            [
                req("none", headers={}, received_at=1.0),
                req("slow", headers={"x-slo-ttft-ms": "5000"}, received_at=2.0),
                req("fast", headers={"x-slo-ttft-ms": "100"}, received_at=3.0),
                req("bad", headers={"x-slo-ttft-ms": "soon"}, received_at=0.5),
            ],
            ["fast", "slow", "bad", "none"],
            id="slo-deadline-earliest-first-invalid-last-by-receive-time",
        ),
    ],
)
async def test_dispatch_order(doc: dict[str, Any], requests: list[Any], expected: list[str]) -> None:
    """Queued while saturated, requests leave in band, fairness and ordering order once room appears."""
    controller, detector = make_controller(doc, detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, requests, done)
        await _release(detector, controller, tasks)
    assert done == expected


async def test_edf_orders_by_enqueue_plus_ttl() -> None:
    """EDF serves the earliest enqueue+TTL deadline first; the band uses a heap for it."""
    controller, detector = make_controller(_band(EdfOrderingPolicy.TYPE), detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = []
        for name, ttl in (("long", 60.0), ("none", None), ("short", 10.0)):
            tasks += await queue_up(controller, [req(name)], done, ttl=ttl)
        assert isinstance(controller._bands[0].flows["default-flow"].queue, HeapQueue)
        await _release(detector, controller, tasks)
    assert done == ["short", "long", "none"]


async def test_not_saturated_dispatches_without_queueing() -> None:
    """With room in the pool and nothing queued ahead, a request is dispatched at once, never queued."""
    controller, _ = make_controller()
    async with controller:
        outcome = await controller.enqueue_and_wait(req(flow="fast-path"), 100)
    assert outcome is Outcome.DISPATCHED
    assert controller.queued == 0
    assert sample(ENQUEUE_DURATION, fairness_id="fast-path", priority="0", outcome="Dispatched") == 1


async def test_higher_band_bypasses_blocked_lower_band() -> None:
    """A high-priority arrival dispatches at once while a lower band waits behind its own ceiling."""
    controller, detector = make_controller(usage=CeilingsByPriority({0: 0.5}), detector=FakeDetector(0.7))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("low", priority=0)], done)
        assert await controller.enqueue_and_wait(req("high", priority=9), 1) is Outcome.DISPATCHED
        assert controller.queued == 1
        await _release(detector, controller, tasks)
    assert done == ["low"]


@pytest.mark.parametrize(
    ("ceilings", "saturation", "dispatched"),
    [
        pytest.param({10: 0.5, 0: 0.9}, 0.7, False, id="blocked-high-band-blocks-lower"),
        pytest.param({10: 0.9, 0: 0.5}, 0.7, True, id="open-high-band-dispatches-its-own"),
        pytest.param({10: 0.9, 0: 0.9}, 0.9, False, id="saturation-equal-to-ceiling-blocks"),
    ],
)
async def test_head_of_line_rule(ceilings: dict[int, float], saturation: float, dispatched: bool) -> None:
    """Bands are walked high to low and the cycle stops at the first band whose ceiling is reached."""
    doc = {"priorityBands": [{"priority": 10}, {"priority": 0}]}
    controller, detector = make_controller(
        doc, usage=CeilingsByPriority(ceilings), detector=FakeDetector(1.0)
    )
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("high", priority=10), req("low", priority=0)], done)
        detector.value = saturation
        assert controller.dispatch_cycle() is dispatched
        assert controller.dispatch_cycle() is False  # the low band never overtakes
        await _release(detector, controller, tasks)
    assert done == ["high", "low"]


async def test_saturation_is_reread_before_every_dispatch() -> None:
    """A burst is released one request at a time: each dispatch lets the request move on, then
    saturation is read again, so dispatching stops as soon as the pool fills."""
    done: list[str] = []
    detector = FakeDetector(fn=lambda: 1.0 if gate.is_set() else len(done) / 2)
    gate = asyncio.Event()
    gate.set()
    controller, _ = make_controller(detector=detector)
    async with controller:
        tasks = await queue_up(controller, [req(f"r{i}") for i in range(5)], done)
        gate.clear()
        controller.notify()
        await asyncio.wait_for(asyncio.gather(*tasks[:2]), 5)
        assert controller.dispatch_cycle() is False
        assert (done, controller.queued) == (["r0", "r1"], 3)
        await controller.stop()
    assert set(await asyncio.gather(*tasks[2:])) == {Outcome.EVICTED_OTHER}


# --- requests in transit --------------------------------------------------------------------------


class TransitCounting(FakeDetector):
    """A pool of ``capacity`` slots: ``placed`` requests hold one each, as do those in transit."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.placed = 0

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.placed / self.capacity

    def saturation_with_transit(
        self, endpoints: Sequence[Endpoint], transit: Collection[InferenceRequest]
    ) -> float:
        return (self.placed + len(transit)) / self.capacity


async def arrive(
    controller: FlowController, requests: Sequence[InferenceRequest], done: list[str]
) -> list[asyncio.Task[Outcome]]:
    """One waiter per request, in order, each run up to its wait (or its dispatch) in turn."""
    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(record(controller, request, done)))
        await asyncio.sleep(0)  # one loop turn: the new task runs up to its wait
    return tasks


async def test_a_burst_waits_for_requests_in_transit() -> None:
    """Dispatched requests count against the pool until the director places them: a burst of
    five on two slots lets two through (both without queueing) and holds three, however many
    dispatch cycles run before either lands; a request placed keeps its slot, one that failed
    before its endpoint counted it frees it for the next."""
    detector = TransitCounting(capacity=2)
    assert isinstance(detector, TransitAwareDetector)
    controller, _ = make_controller(detector=detector)
    done: list[str] = []
    requests = [req(f"r{i}") for i in range(5)]
    async with controller:
        tasks = await arrive(controller, requests, done)
        assert (done, controller.queued, controller.in_transit) == (["r0", "r1"], 3, 2)
        assert controller.dispatch_cycle() is False
        detector.placed += 1  # r0's in-flight counters have it now
        controller.placed(requests[0], scheduled=True)
        assert controller.dispatch_cycle() is False
        controller.placed(requests[1], scheduled=False)  # r1 failed before reaching an endpoint
        await asyncio.wait_for(tasks[2], 5)
        assert (done, controller.queued, controller.in_transit) == (["r0", "r1", "r2"], 2, 1)
        assert controller.debug_state()["inTransit"] == 1
        controller.placed(requests[1], scheduled=False)  # a second report changes nothing
        assert controller.dispatch_cycle() is False
        await controller.stop()
    assert set(await asyncio.gather(*tasks[3:])) == {Outcome.EVICTED_OTHER}


async def test_a_dispatched_request_whose_client_left_gives_its_slot_back() -> None:
    """Cancelled after its dispatch but before it ran again: it leaves transit, and the next
    request waiting gets the slot."""
    detector = TransitCounting(capacity=1)
    controller, _ = make_controller(detector=detector)
    done: list[str] = []
    requests = [req("a"), req("b"), req("c")]
    async with controller:
        a, b, c = await arrive(controller, requests, done)
        detector.placed += 1
        controller.placed(requests[0], scheduled=True)
        controller.placed(req("stranger"), scheduled=False)  # never dispatched: ignored
        assert (controller.queued, controller.in_transit) == (2, 0)
        detector.placed -= 1  # a finished
        assert controller.dispatch_cycle() is True  # b: its future is set, it has not run yet
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert await asyncio.wait_for(c, 5) is Outcome.DISPATCHED
        assert (await a, done, controller.in_transit) == (Outcome.DISPATCHED, ["a", "c"], 1)


# --- capacity ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "first", "second", "size"),
    [
        pytest.param({"maxRequests": 1}, req("a", priority=0), req("b", priority=5), 1, id="global-requests"),
        pytest.param({"maxBytes": 150}, req("a", priority=0), req("b", priority=5), 100, id="global-bytes"),
        pytest.param(
            {"defaultPriorityBand": {"maxRequests": 1}},
            req("a", flow="x"),
            req("b", flow="y"),
            1,
            id="band-requests",
        ),
        pytest.param(
            {"priorityBands": [{"priority": 0, "maxBytes": "150"}]},
            req("a", flow="x"),
            req("b", flow="y"),
            100,
            id="band-bytes",
        ),
    ],
)
async def test_capacity_rejection(doc: dict[str, Any], first: Any, second: Any, size: int) -> None:
    """Queued requests count against global then band limits; the one that does not fit is rejected."""
    controller, detector = make_controller(doc, detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [first], done, size=size)
        assert await controller.enqueue_and_wait(second, size) is Outcome.REJECTED_CAPACITY
        await _release(detector, controller, tasks)
    assert done == ["a"]


async def test_dispatched_requests_free_capacity() -> None:
    """Capacity counts only queued requests: once one leaves, the next fits."""
    controller, detector = make_controller({"maxRequests": 1}, detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a")], done)
        await _release(detector, controller, tasks)
        detector.value = 1.0
        tasks = await queue_up(controller, [req("b")], done)
        await _release(detector, controller, tasks)
    assert done == ["a", "b"]


# --- leaving the queue without dispatch --------------------------------------------------------


async def test_ttl_eviction() -> None:
    """A request still queued when its TTL runs out leaves as EvictedTTL, and its queue is empty."""
    controller, _ = make_controller({"defaultRequestTTL": "20ms"}, detector=FakeDetector(1.0))
    async with controller:
        outcome = await asyncio.wait_for(controller.enqueue_and_wait(req(flow="ttl"), 10), 5)
        assert outcome is Outcome.EVICTED_TTL
        assert controller.queued == 0
    labels = {"fairness_id": "ttl", "priority": "0", "inference_pool": controller._pool}
    assert sample(QUEUE_DURATION, outcome="EvictedTTL", model_name="m", target_model_name="m", **labels) == 1
    assert sample(QUEUE_SIZE, model_name="m", target_model_name="m", **labels) == 0


async def test_per_request_ttl_overrides_default() -> None:
    """A request's own TTL wins over defaultRequestTTL (GIE's InitialEffectiveTTL)."""
    controller, _ = make_controller({"defaultRequestTTL": "1h"}, detector=FakeDetector(1.0))
    async with controller:
        outcome = await asyncio.wait_for(controller.enqueue_and_wait(req(), 1, ttl=0.01), 5)
    assert outcome is Outcome.EVICTED_TTL


@pytest.mark.parametrize("ordering", [FcfsOrderingPolicy.TYPE, EdfOrderingPolicy.TYPE])
async def test_cancellation_removes_request_at_once(ordering: str) -> None:
    """Cancelling a waiter (client gone) takes its request out of the queue immediately: the gauges
    drop to 0, the outcome is EvictedContextCancelled, and later requests are unaffected."""
    controller, detector = make_controller(_band(ordering), detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a", flow="cancel"), req("b", flow="cancel")], done, size=7)
        labels = {
            "fairness_id": "cancel",
            "priority": "0",
            "inference_pool": controller._pool,
            "model_name": "m",
            "target_model_name": "m",
        }
        assert (sample(QUEUE_SIZE, **labels), sample(QUEUE_BYTES, **labels)) == (2, 14)
        tasks[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]
        assert controller.queued == 1
        assert (sample(QUEUE_SIZE, **labels), sample(QUEUE_BYTES, **labels)) == (1, 7)
        await _release(detector, controller, tasks[1:])
        assert (sample(QUEUE_SIZE, **labels), sample(QUEUE_BYTES, **labels)) == (0, 0)
    assert done == ["b"]
    assert sample(QUEUE_DURATION, outcome="EvictedContextCancelled", **labels) == 1


async def test_stop_evicts_waiters_and_rejects_newcomers() -> None:
    """Shutdown finalises queued requests as EvictedOther; afterwards requests are RejectedOther."""
    controller, _ = make_controller(detector=FakeDetector(1.0))
    done: list[str] = []
    await controller.start()
    tasks = await queue_up(controller, [req("a")], done)
    await controller.stop()
    assert await tasks[0] is Outcome.EVICTED_OTHER
    assert await controller.enqueue_and_wait(req("b"), 1) is Outcome.REJECTED_OTHER
    assert controller.queued == 0


# --- dispatcher wake-ups ----------------------------------------------------------------------------


async def test_idle_dispatcher_does_not_poll() -> None:
    """With nothing queued the dispatcher sleeps: no saturation reads while idle (not a 1 ms loop)."""
    controller, detector = make_controller(tick=0.001)
    async with controller:
        await asyncio.sleep(0.02)  # the idle window being observed, not a synchronisation
    assert detector.calls == 0


@pytest.mark.parametrize(
    ("tick", "notify"),
    [
        pytest.param(0.001, False, id="tick-while-waiting"),
        pytest.param(3600.0, True, id="notify-hook"),
    ],
)
async def test_waiting_requests_are_rechecked(tick: float, notify: bool) -> None:
    """While requests wait, saturation is re-read every tick, or at once on notify()."""
    controller, detector = make_controller(detector=FakeDetector(1.0), tick=tick)
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a")], done)
        detector.value = 0.0
        if notify:
            controller.notify()
        assert await asyncio.wait_for(tasks[0], 5) is Outcome.DISPATCHED


async def test_failing_detector_does_not_kill_dispatcher() -> None:
    """A detector that raises skips the cycle; dispatching resumes when it recovers."""
    broken = True

    def saturation() -> float:
        if broken:
            raise RuntimeError("boom")
        return 0.0

    controller, detector = make_controller(detector=FakeDetector(1.0), tick=0.001)
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a")], done)
        detector.fn = saturation
        controller.notify()
        await asyncio.sleep(0)  # one loop turn: the woken dispatcher runs its (failing) cycle first
        assert detector.calls >= 1
        assert not tasks[0].done()
        broken = False
        assert await asyncio.wait_for(tasks[0], 5) is Outcome.DISPATCHED


# --- bands and garbage collection --------------------------------------------------------------


async def test_gc_collects_idle_flows_and_jit_bands() -> None:
    """Idle flows go after the flow timeout with their metric series; bands made on first use go
    after the band timeout; configured bands stay; a flow with a waiter is never collected."""
    controller, detector = make_controller(
        {"priorityBands": [{"priority": 1}]}, flow_gc_timeout=10.0, band_gc_timeout=20.0, clock=lambda: 0.0
    )
    async with controller:
        for priority in (1, 7):
            assert (
                await controller.enqueue_and_wait(req(flow="gc", priority=priority), 1) is Outcome.DISPATCHED
            )
        detector.value = 1.0
        done: list[str] = []
        tasks = await queue_up(controller, [req(flow="busy", priority=1)], done)
        labels = {"fairness_id": "gc", "priority": "7", "outcome": "Dispatched"}
        assert sample(ENQUEUE_DURATION, **labels) == 1

        controller.collect_garbage(now=9.0)
        assert set(controller._bands[7].flows) == {"gc"}
        controller.collect_garbage(now=10.0)
        assert (set(controller._bands[1].flows), set(controller._bands[7].flows)) == ({"busy"}, set())
        assert sample(ENQUEUE_DURATION, **labels) == 0
        controller.collect_garbage(now=29.0)
        assert 7 in controller._bands
        controller.collect_garbage(now=30.0)
        assert sorted(controller._bands) == [1]
        await _release(detector, controller, tasks)
        assert await controller.enqueue_and_wait(req(flow="gc", priority=7), 1) is Outcome.DISPATCHED


async def test_jit_band_uses_template() -> None:
    """An unconfigured priority gets a band from defaultPriorityBand, with its policies and limits."""
    doc = {"defaultPriorityBand": {"maxRequests": 3, "orderingPolicyRef": EdfOrderingPolicy.TYPE}}
    controller, _ = make_controller(doc, detector=FakeDetector(1.0))
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a", priority=42)], done)
        band = controller._bands[42]
        assert (band.jit, band.max_requests, band.max_bytes) == (True, 3, 1_000_000_000)
        assert isinstance(band.flows["default-flow"].queue, HeapQueue)
        assert isinstance(band.ordering, EdfOrderingPolicy)
        await controller.stop()
    assert await tasks[0] is Outcome.EVICTED_OTHER


# --- construction --------------------------------------------------------------------------------


def test_from_plan_builds_the_shipped_example() -> None:
    """config/examples/flow-control.yaml builds with the real registry into a working controller."""
    plan = build(load_config_file(EXAMPLE), default_registry(entry_points=False)).admission.flow_control
    assert plan is not None
    controller = FlowController.from_plan(plan, endpoints=tuple, pool_name="example")
    band = controller._bands[100]
    assert (band.jit, band.max_bytes, band.max_requests) == (False, 500_000_000, 0)
    assert isinstance(band.new_flow("x", 0.0).queue, ListQueue)
    assert controller._ttl == 30.0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param(
            {"defaultPriorityBand": {"orderingPolicyRef": "nope"}},
            "flowControl.defaultPriorityBand.orderingPolicyRef: no ordering policy registered for name",
            id="unknown-ordering",
        ),
        pytest.param(
            {"priorityBands": [{"priority": 3, "fairnessPolicyRef": FcfsOrderingPolicy.TYPE}]},
            "flowControl.priorityBands[0].fairnessPolicyRef: no fairness policy registered for name",
            id="fairness-ref-to-an-ordering-policy",
        ),
    ],
)
def test_bad_policy_references_fail_at_construction(doc: dict[str, Any], message: str) -> None:
    """Band policy references are resolved when the controller is built, not on first use."""
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        make_controller(doc)


def test_builder_checks_policy_kinds() -> None:
    """With the real registry, a band reference to a plugin of the wrong kind fails the build."""
    text = EXAMPLE.read_text().replace("orderingPolicyRef: fcfs-ordering-policy", "orderingPolicyRef: rr")
    text = text.replace("plugins:\n", "plugins:\n  - {name: rr, type: round-robin-fairness-policy}\n", 1)
    with pytest.raises(
        ConfigError, match=r"priorityBands\[0\]\.orderingPolicyRef: plugin \"rr\" is not a flowcontrol"
    ):
        build(load_config(text), default_registry(entry_points=False))


async def test_scale_from_zero_waits_for_endpoints() -> None:
    """With no endpoints the utilization detector reports 1.0: requests wait, then go when one appears."""
    pool: list[Any] = []
    detector = UtilizationDetector("utilization-detector", UtilizationDetectorParams(), FakeHandle())
    controller = FlowController(
        settings(),
        detector=detector,
        usage_limit=StaticUsageLimitPolicy("limits", StaticUsageLimitParams(), FakeHandle()),
        plugins=policy_plugins(),
        endpoints=lambda: pool,
        tick=3600.0,
    )
    done: list[str] = []
    async with controller:
        tasks = await queue_up(controller, [req("a")], done)
        assert controller.dispatch_cycle() is False
        pool.append(endpoint(0))
        controller.notify()
        assert await asyncio.wait_for(tasks[0], 5) is Outcome.DISPATCHED
