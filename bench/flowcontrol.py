"""Flow-control micro-benchmark: admission overhead when not saturated, dispatch hand-off, dispatches/s.

Run ``python -m bench.flowcontrol [--quick]``; prints a table and writes bench/results/flowcontrol.json.
Saturation comes from the real ``utilization-detector`` over 10 endpoints (one read per dispatch);
a switch in front of it holds the pool saturated while a backlog is built.  The baseline, measured
in the same run, is legacy admission (one saturation read per request).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from epp.admission.shedding import LegacyAdmission
from epp.config.schema import FlowControlConfig
from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.flowcontrol.api import Outcome
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.detectors.utilization import UtilizationDetector, UtilizationDetectorParams
from epp.flowcontrol.fairness.global_strict import GlobalStrictFairnessPolicy
from epp.flowcontrol.fairness.round_robin import RoundRobinFairnessPolicy
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.usage_limits.static import StaticUsageLimitParams, StaticUsageLimitPolicy
from epp.plugin.base import NoParams, Plugin, PluginBase
from epp.request import InferenceRequest
from epp.testing.plugins import FakeHandle

RESULTS = Path(__file__).parent / "results" / "flowcontrol.json"
PRIORITIES = 8
ENDPOINTS = 10
COMBOS = (
    (GlobalStrictFairnessPolicy.TYPE, FcfsOrderingPolicy.TYPE),
    (RoundRobinFairnessPolicy.TYPE, FcfsOrderingPolicy.TYPE),
    (GlobalStrictFairnessPolicy.TYPE, EdfOrderingPolicy.TYPE),
)
GOALS = {"fast_path_ratio_to_legacy_p50": 3.0, "dispatches_per_s": 20_000.0}


class _Switch(PluginBase):
    """Saturated while ``hold`` is set; otherwise the wrapped detector's reading."""

    TYPE: ClassVar[str] = "bench-switch"

    def __init__(self, inner: UtilizationDetector) -> None:
        super().__init__("switch", NoParams(), FakeHandle())
        self.inner = inner
        self.hold = False

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return 1.0 if self.hold else self.inner.saturation(endpoints)


def _endpoints() -> tuple[Endpoint, ...]:
    now = time.monotonic()
    return tuple(
        Endpoint(
            EndpointMetadata(name=f"bench/pod-{i}-rank-0", address=f"10.0.0.{i + 1}", port=8000),
            Metrics(waiting_queue_size=i % 3, kv_cache_usage_percent=0.2, update_time=now),
        )
        for i in range(ENDPOINTS)
    )


def _detector() -> UtilizationDetector:
    detector = UtilizationDetector("utilization-detector", UtilizationDetectorParams(), FakeHandle())
    detector.metrics_staleness_threshold = math.inf  # the endpoints' metrics never age in the bench
    return detector


def _controller(fairness: str, ordering: str, detector: Any) -> FlowController:
    h = FakeHandle()
    plugins: dict[str, Plugin] = {
        cls.TYPE: cls(cls.TYPE, NoParams(), h)
        for cls in (
            GlobalStrictFairnessPolicy,
            RoundRobinFairnessPolicy,
            FcfsOrderingPolicy,
            EdfOrderingPolicy,
        )
    }
    settings = FlowControlConfig.model_validate(
        {
            "defaultRequestTTL": "1h",
            "defaultPriorityBand": {"fairnessPolicyRef": fairness, "orderingPolicyRef": ordering},
        }
    ).resolved()
    eps = _endpoints()
    return FlowController(
        settings,
        detector=detector,
        usage_limit=StaticUsageLimitPolicy("limits", StaticUsageLimitParams(), h),
        plugins=plugins,
        endpoints=lambda: eps,
        pool_name="bench",
    )


def _req(i: int, flows: int) -> InferenceRequest:
    return InferenceRequest(
        request_id=f"r{i}",
        headers={},
        fairness_id=f"tenant-{i % flows}",
        priority=(i // flows) % PRIORITIES,
        incoming_model="bench-model",
        target_model="bench-model",
    )


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _stats(samples: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"p50": round(statistics.median(us), 2), "p99": round(_pct(us, 0.99), 2)}


async def bench_fast_path(iterations: int) -> dict[str, Any]:
    """Per-request admission time with room in the pool: flow control vs legacy admission."""
    detector = _detector()
    controller = _controller(GlobalStrictFairnessPolicy.TYPE, FcfsOrderingPolicy.TYPE, detector)
    legacy = LegacyAdmission(detector)
    eps = _endpoints()
    requests = [_req(i, 100) for i in range(256)]
    sheddable = InferenceRequest(request_id="s", headers={}, priority=-1)
    perf = time.perf_counter
    fc: list[float] = []
    base: list[float] = []
    gc.collect()
    async with controller:
        for i in range(iterations + iterations // 4):
            r = requests[i % len(requests)]
            t0 = perf()
            outcome = await controller.enqueue_and_wait(r, 1000)
            t1 = perf()
            await legacy.admit(sheddable, eps)
            t2 = perf()
            assert outcome is Outcome.DISPATCHED
            if i >= iterations // 4:
                fc.append(t1 - t0)
                base.append(t2 - t1)
    flow_control, legacy_us = _stats(fc), _stats(base)
    return {
        "iterations": iterations,
        "flow_control_us": flow_control,
        "legacy_admission_us": legacy_us,
        "ratio_p50": round(flow_control["p50"] / max(legacy_us["p50"], 1e-9), 2),
    }


async def bench_handoff(iterations: int) -> dict[str, Any]:
    """A queued request's wait from ``notify()`` (room appeared) to its waiter running again."""
    switch = _Switch(_detector())
    controller = _controller(GlobalStrictFairnessPolicy.TYPE, FcfsOrderingPolicy.TYPE, switch)
    samples: list[float] = []
    async with controller:
        for i in range(iterations):
            switch.hold = True
            task = asyncio.create_task(controller.enqueue_and_wait(_req(i, 10), 1000))
            await asyncio.sleep(0)  # let it park
            switch.hold = False
            t0 = time.perf_counter()
            controller.notify()
            assert await task is Outcome.DISPATCHED
            samples.append(time.perf_counter() - t0)
    return {"iterations": iterations, "notify_to_dispatched_us": _stats(samples)}


async def bench_throughput(fairness: str, ordering: str, flows: int, requests: int) -> dict[str, Any]:
    """Fill a backlog over ``flows`` flows x 8 priorities while saturated, then time the drain."""
    switch = _Switch(_detector())
    controller = _controller(fairness, ordering, switch)
    reqs = [_req(i, flows) for i in range(requests)]
    gc.collect()
    async with controller:
        switch.hold = True
        t0, c0 = time.perf_counter(), time.process_time()
        tasks = [asyncio.create_task(controller.enqueue_and_wait(r, 1000)) for r in reqs]
        await asyncio.sleep(0)  # one loop turn runs every new task up to its wait
        assert controller.queued == requests
        t1, c1 = time.perf_counter(), time.process_time()
        switch.hold = False
        controller.notify()
        outcomes = await asyncio.gather(*tasks)
        t2, c2 = time.perf_counter(), time.process_time()
    assert all(o is Outcome.DISPATCHED for o in outcomes)
    return {
        "fairness": fairness,
        "ordering": ordering,
        "flows": flows,
        "priorities": PRIORITIES,
        "requests": requests,
        "enqueues_per_s": round(requests / (t1 - t0)),
        "dispatches_per_s": round(requests / (t2 - t1)),
        # Per CPU-second of this process: steadier than wall time on a shared machine.
        "enqueues_per_cpu_s": round(requests / max(c1 - c0, 1e-9)),
        "dispatches_per_cpu_s": round(requests / max(c2 - c1, 1e-9)),
    }


async def bench_memory(queued: int) -> dict[str, Any]:
    """Bytes held per queued request (item, future, waiting task, TTL timer)."""
    switch = _Switch(_detector())
    controller = _controller(GlobalStrictFairnessPolicy.TYPE, FcfsOrderingPolicy.TYPE, switch)
    reqs = [_req(i, 100) for i in range(queued)]
    async with controller:
        switch.hold = True
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        tasks = [asyncio.create_task(controller.enqueue_and_wait(r, 1000)) for r in reqs]
        await asyncio.sleep(0)
        assert controller.queued == queued
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        switch.hold = False
        controller.notify()
        await asyncio.gather(*tasks)
    return {"queued": queued, "bytes_per_queued_request": round(used / queued)}


async def run(quick: bool) -> dict[str, Any]:
    fast = await bench_fast_path(2000 if quick else 20000)
    print(
        f"not saturated, per request: flow control p50/p99 {fast['flow_control_us']['p50']}/"
        f"{fast['flow_control_us']['p99']} us; legacy admission {fast['legacy_admission_us']['p50']}/"
        f"{fast['legacy_admission_us']['p99']} us (ratio p50 {fast['ratio_p50']})"
    )
    handoff = await bench_handoff(200 if quick else 2000)
    h = handoff["notify_to_dispatched_us"]
    print(f"queued -> dispatched after notify(): p50/p99 {h['p50']}/{h['p99']} us")
    flows, requests = (200, 4000) if quick else (1000, 40000)
    print(
        f"{'fairness':>31} {'ordering':>21} | {'flows':>5} x{PRIORITIES} | {'enqueue/s':>9} |"
        f" {'dispatch/s':>10} | {'dispatch/cpu-s':>14}"
    )
    throughput = []
    for fairness, ordering in COMBOS:
        t = await bench_throughput(fairness, ordering, flows, requests)
        throughput.append(t)
        print(
            f"{fairness:>31} {ordering:>21} | {flows:>5} x{PRIORITIES} |"
            f" {t['enqueues_per_s']:>9} | {t['dispatches_per_s']:>10} | {t['dispatches_per_cpu_s']:>14}"
        )
    memory = await bench_memory(2000 if quick else 10000)
    print(f"memory: {memory['bytes_per_queued_request']} B per queued request")
    return {
        "fast_path": fast,
        "handoff": handoff,
        "throughput": throughput,
        "memory": memory,
        "goals": {
            "fast_path_ratio_to_legacy_p50": {
                "goal": GOALS["fast_path_ratio_to_legacy_p50"],
                "measured": fast["ratio_p50"],
            },
            "dispatches_per_s": {
                "goal": GOALS["dispatches_per_s"],
                "worst": min(t["dispatches_per_s"] for t in throughput),
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flowcontrol", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations and a smaller backlog")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        import uvloop  # the EPP's event loop in production
    except ImportError:  # pragma: no cover - uvloop is a runtime dependency
        loop_name, results = "asyncio", asyncio.run(run(args.quick))
    else:
        loop_name, results = "uvloop", uvloop.run(run(args.quick))
    doc = {
        "benchmark": "flowcontrol",
        "mode": "quick" if args.quick else "full",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "event_loop": loop_name,
        "setup": f"utilization-detector over {ENDPOINTS} endpoints, static-usage-limit-policy, TTL 1h",
        **results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
