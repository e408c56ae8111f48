"""What /debug/plugins/state shows of flow control: queue depths per band and flow, and detector
verdicts (per P/D stage) computed on demand without touching the controller's gauges."""

from __future__ import annotations

from epp.datalayer.api import Endpoint
from epp.datalayer.roles import ROLE_LABEL
from epp.flowcontrol.detectors.utilization import UtilizationDetector
from epp.flowcontrol.verdict import verdict
from epp.testing.builders import make_endpoint
from epp.testing.flowcontrol import CeilingsByPriority, FakeDetector
from epp.testing.plugins import build
from epp.testing.waiting import until
from tests.flowcontrol.helpers import make_controller, queue_up, req, sample


async def test_queue_depths_per_band_and_flow_follow_enqueues_and_dispatches() -> None:
    now = [100.0]
    controller, detector = make_controller(
        {"priorityBands": [{"priority": 0, "maxRequests": 10}]},
        detector=FakeDetector(1.0),  # saturated: everything waits
        clock=lambda: now[0],
    )
    async with controller:
        idle = controller.debug_state()
        assert (idle["queued"], idle["bytes"]) == (0, 0)
        assert [(b["priority"], b["queued"], b["flows"]) for b in idle["bands"]] == [(0, 0, {})]
        assert idle["saturation"]["saturated"] is True
        assert idle["bands"][0]["open"] is False

        done: list[str] = []
        tasks = await queue_up(controller, [req("a1", flow="a")], done, size=10)
        now[0] += 2.0
        tasks += await queue_up(controller, [req("a2", flow="a"), req("b1", flow="b")], done, size=10)
        now[0] += 1.0
        tasks += await queue_up(controller, [req("h1", flow="a", priority=5)], done, size=7)
        now[0] += 0.5

        state = controller.debug_state()
        assert (state["queued"], state["bytes"]) == (4, 37)
        high, low = state["bands"]  # highest priority first, as dispatch walks them
        assert (high["priority"], high["queued"], high["bytes"], high["maxRequests"]) == (5, 1, 7, None)
        assert high["flows"] == {"a": {"queued": 1, "bytes": 7, "oldestWaitSeconds": 0.5}}
        assert (low["priority"], low["queued"], low["bytes"], low["maxRequests"]) == (0, 3, 30, 10)
        assert low["flows"] == {
            "a": {"queued": 2, "bytes": 20, "oldestWaitSeconds": 3.5},
            "b": {"queued": 1, "bytes": 10, "oldestWaitSeconds": 1.5},
        }
        assert low["flowsWithQueue"] == 2
        assert controller.debug_state(max_flows=1)["bands"][1]["flows"].keys() == {"a"}  # the deepest

        detector.value = 0.0  # capacity frees up: the queues drain
        controller.notify()
        await until(lambda: controller.queued == 0, what="queues drained")
        drained = controller.debug_state()
        assert drained["queued"] == 0
        assert all(b["queued"] == 0 and b["flows"] == {} and b["open"] for b in drained["bands"])
        assert drained["saturation"]["saturated"] is False
    assert sorted(done) == ["a1", "a2", "b1", "h1"]


async def test_a_band_below_a_blocked_one_is_not_open() -> None:
    controller, _ = make_controller(
        {"priorityBands": [{"priority": 5}, {"priority": 0}]},
        usage=CeilingsByPriority({5: 0.9, 0: 0.5}),
        detector=FakeDetector(0.7),
    )
    bands = controller.debug_state()["bands"]
    assert [(b["priority"], b["ceiling"], b["open"]) for b in bands] == [(5, 0.9, True), (0, 0.5, False)]
    controller, _ = make_controller(
        {"priorityBands": [{"priority": 5}, {"priority": 0}]},
        usage=CeilingsByPriority({5: 0.5, 0: 0.9}),
        detector=FakeDetector(0.7),
    )
    bands = controller.debug_state()["bands"]
    assert [b["open"] for b in bands] == [False, False]  # head-of-line: blocked behind priority 5


def _ep(i: int, queue: int, role: str | None = None) -> Endpoint:
    return make_endpoint(i, queue=queue, labels={} if role is None else {ROLE_LABEL: role})


def _detector() -> UtilizationDetector:
    d: UtilizationDetector = build(UtilizationDetector, metricsStalenessThreshold="1h")
    return d


def test_verdict_of_a_saturated_and_an_idle_fleet() -> None:
    d = _detector()
    busy = verdict(d, [_ep(0, 10), _ep(1, 5)])  # queues over the threshold of 5
    assert busy == {"type": "utilization-detector", "saturation": 1.5, "saturated": True, "stages": None}
    idle = verdict(d, [_ep(0, 1), _ep(1, 0)])
    assert (idle["saturation"], idle["saturated"]) == (0.1, False)


def test_verdict_per_pd_stage_reads_prefill_and_decode_apart() -> None:
    d = _detector()
    eps = [_ep(0, 10, "prefill"), _ep(1, 0, "decode"), _ep(2, 1)]
    v = verdict(d, eps)
    assert v["stages"] == {"prefill": 2.0, "decode": 0.1, "effective": 2.0}
    assert (v["saturation"], v["saturated"]) == (2.0, True)  # the prefill stage gates the pool
    eps = [_ep(0, 0, "prefill"), _ep(1, 10, "decode")]
    assert verdict(d, eps)["stages"] == {"prefill": 0.0, "decode": 2.0, "effective": 2.0}


async def test_debug_state_leaves_the_saturation_gauges_alone() -> None:
    controller, detector = make_controller(detector=FakeDetector(0.3))
    pool = controller._pool
    gauge = "inference_extension_flow_control_pool_saturation"
    before = sample(gauge, inference_pool=pool)
    detector.value = 0.9
    assert controller.debug_state()["saturation"]["saturation"] == 0.9
    assert sample(gauge, inference_pool=pool) == before
