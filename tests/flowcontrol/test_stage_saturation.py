"""Per-stage pool saturation (llm-d-router PR #2221): prefill, decode and effective = their maximum."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from epp.datalayer.api import Endpoint
from epp.datalayer.roles import ROLE_LABEL, partition
from epp.flowcontrol.api import Outcome
from epp.metrics.series import REGISTRY
from epp.testing.builders import make_endpoint
from epp.testing.flowcontrol import FakeDetector
from epp.testing.waiting import until
from tests.flowcontrol.helpers import make_controller, req


class QueueDetector(FakeDetector):
    """Saturation = the largest waiting queue among the endpoints it is asked about, / 10."""

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.calls += 1
        return max(ep.metrics.waiting_queue_size for ep in endpoints) / 10


def _ep(i: int, role: str | None, queue: int) -> Endpoint:
    return make_endpoint(i, queue=queue, labels={} if role is None else {ROLE_LABEL: role})


def _stage(pool: str, stage: str) -> float | None:
    return REGISTRY.get_sample_value(
        "llm_d_epp_flow_control_pool_saturation", {"inference_pool": pool, "stage": stage}
    )


def test_partition_follows_llm_ds_rules() -> None:
    eps = [_ep(0, None, 0), _ep(1, "decode", 0), _ep(2, "prefill", 0), _ep(3, "both", 0), _ep(4, "encode", 0)]
    parts = partition(eps)
    assert parts is not None
    prefill, decode = parts
    assert [e.metadata.pod_name for e in prefill] == ["pod-2", "pod-3"]
    assert [e.metadata.pod_name for e in decode] == ["pod-0", "pod-1", "pod-3"]
    assert partition([_ep(0, None, 0), _ep(1, "decode", 0)]) is None  # nothing to split


async def test_saturated_prefill_stage_holds_requests_although_decode_has_room() -> None:
    """Effective saturation is the prefill stage's 1.2: the request queues; the gauge shows each stage."""
    eps = [_ep(0, "prefill", 12), _ep(1, "decode", 1), _ep(2, None, 2)]
    controller, _ = make_controller(detector=QueueDetector(), endpoints=eps)
    pool = controller._pool
    async with controller:
        task = asyncio.create_task(controller.enqueue_and_wait(req(flow="pd"), 100))
        await until(lambda: controller.queued == 1, what="the request waits in its queue")
        assert not task.done()
        assert (_stage(pool, "prefill"), _stage(pool, "decode"), _stage(pool, "effective")) == (1.2, 0.2, 1.2)
        await controller.stop()
    assert await task is Outcome.EVICTED_OTHER


async def test_without_roles_every_stage_reads_the_whole_pool() -> None:
    eps = [_ep(0, None, 3), _ep(1, "decode", 5)]
    controller, _ = make_controller(detector=QueueDetector(), endpoints=eps)
    async with controller:
        assert await controller.enqueue_and_wait(req(flow="agg"), 100) is Outcome.DISPATCHED
    pool = controller._pool
    assert _stage(pool, "decode") == 0.5
    assert _stage(pool, "effective") == 0.5
    assert _stage(pool, "prefill") is None
