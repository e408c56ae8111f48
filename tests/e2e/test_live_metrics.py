"""Issue 6: the EPP routes by live metrics scraped from the replicas, through Envoy."""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter

import pytest

from tests.e2e.conftest import Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Real-time-ish replicas: a request takes tens of milliseconds, so queues form under load.
SIM = ("--time-scale", "0.5", "--seed", "3", "--max-num-seqs", "4")


async def load(
    s: Stack, seconds: float, rate: float, *, after: dict[str, object] | None = None
) -> list[tuple[float, str]]:
    """Open-loop load; returns (send time offset, replica that answered) per successful request.

    ``after``: faults to set on replica 0 once sending stops (e.g. unpause a stuck replica so
    the requests it holds can finish).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    out: list[tuple[float, str]] = []

    async def one(i: int, at: float) -> None:
        r = await s.post(
            "/v1/completions", {"model": "mock-model", "prompt": f"req {i} " * 8, "max_tokens": 16}
        )
        if r.status == 200:
            out.append((at, r.served_by))

    tasks = []
    i = 0
    while (now := loop.time() - start) < seconds:
        tasks.append(asyncio.create_task(one(i, now)))
        i += 1
        await asyncio.sleep(1 / rate)  # pacing: arrivals at `rate`
    if after:
        await s.sim_faults(0, **after)
    await asyncio.gather(*tasks)
    return out


def share(samples: list[tuple[float, str]], replica: str, since: float) -> float:
    window = [who for at, who in samples if at >= since]
    return Counter(window)[replica] / max(len(window), 1)


@pytest.mark.parametrize(
    ("fault", "gate"),
    [
        pytest.param({"slowdown": 25.0}, [], id="slow-replica"),
        pytest.param({"paused": True}, [], id="stuck-replica-queue-grows"),
        pytest.param({"paused": True}, ["--config-text=" + "\n".join([
            "apiVersion: inference.networking.x-k8s.io/v1alpha1",
            "kind: EndpointPickerConfig",
            "featureGates: [enableLegacyMetrics]",
            "plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}, {type: prefix-cache-scorer}]",
            "schedulingProfiles:",
            "- name: default",
            "  plugins: [{pluginRef: queue-scorer, weight: 2}, {pluginRef: kv-cache-utilization-scorer, weight: 2},",
            "            {pluginRef: prefix-cache-scorer, weight: 3}]",
        ])], id="legacy-metrics-gate"),
    ],
)  # fmt: skip
async def test_degraded_replica_loses_traffic(
    tmp_path: pathlib.Path, fault: dict[str, object], gate: list[str]
) -> None:
    """A replica made slow or stuck builds a queue; within a few 50 ms scrapes it gets (almost) no traffic."""
    async with make_stack(tmp_path, replicas=3, sim_args=SIM, epp_args=gate) as s:
        victim = s.fleet.hostports[0]
        await s.sim_faults(0, **fault)
        samples = await load(
            s, seconds=3.0, rate=30, after={"paused": False} if fault.get("paused") else None
        )
    # After the first second the victim's queue is visible in its metrics and it is avoided.
    assert share(samples, victim, since=1.0) < 0.1, Counter(who for _, who in samples)
    assert len({who for _, who in samples}) >= 2


async def test_pool_gauges_and_per_pod_queue(tmp_path: pathlib.Path) -> None:
    """Pool gauges count fresh endpoints; the per-pod queue gauge shows a stuck replica's queue."""
    async with make_stack(
        tmp_path, replicas=2, sim_args=SIM, epp_args=["--refresh-prometheus-metrics-interval=200ms"]
    ) as s:
        await s.sim_faults(1, paused=True)
        stuck = s.fleet.hostports[1]
        body = {"model": "mock-model", "prompt": "queued", "max_tokens": 2}
        # Straight to the stuck replica (the EPP would avoid it): three requests sit in its queue.
        tasks = [
            asyncio.create_task(s.http.post(f"http://{stuck}/v1/completions", json=body)) for _ in range(3)
        ]
        pod_line = f'inference_pool_per_pod_queue_size{{model_server_pod="{stuck}",name="epp"}}'
        async with asyncio.timeout(10):
            while True:
                text = await s.epp_metrics()
                queue = next(
                    (ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln.startswith(pod_line)), "0"
                )
                if float(queue) >= 3 and 'inference_pool_ready_pods{name="epp"} 2.0' in text:
                    break
                await asyncio.sleep(0.1)  # poll interval (another process: no event to wait on)
        await s.sim_faults(1, paused=False)
        for t in tasks:
            (await t).release()
