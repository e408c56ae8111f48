"""Overload at about twice the fleet's capacity: the EPP sheds sheddable requests with 429, critical
ones keep being served with bounded latency, the EPP's memory stays flat, and when the load drops
sheddable requests are served again without anyone stepping in."""

from __future__ import annotations

import pathlib
import statistics
import time

import aiohttp
import pytest

from tests.e2e.conftest import Stack, make_stack, open_loop
from tests.e2e.test_request_control import REWRITES, SHEDDING

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Two replicas, two sequences each, ~20 ms per decode step: roughly 25-30 requests/s in all.
SLOW_SIM = ("--time-scale", "1.0", "--seed", "3", "--max-num-seqs", "2", "--decode-ms-per-seq", "20")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def send(s: Stack, objective: str, i: int, out: list[tuple[str, float, int, float]]) -> None:
    t = time.monotonic()
    body = {"model": "mock-model", "prompt": f"{objective} {i}", "max_tokens": 5}
    try:
        async with s.http.post(s.url + "/v1/completions", json=body,
                               headers={"x-gateway-inference-objective": objective}) as r:  # fmt: skip
            await r.read()
            out.append((objective, t, r.status, time.monotonic() - t))
    except aiohttp.ClientError:
        out.append((objective, t, -1, time.monotonic() - t))


async def mixed_load(s: Stack, rate: float, seconds: float, out: list[tuple[str, float, int, float]]) -> None:
    """Half critical, half sheddable ("batch"), alternating."""
    await open_loop(lambda i: send(s, "batch" if i % 2 else "critical", i, out), rate, seconds)


async def test_overload_sheds_sheddable_keeps_critical_and_recovers(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=2, sim_args=SLOW_SIM, config=SHEDDING, objectives=REWRITES) as s:
        rss_before = rss_mib(s.epp.pid)
        overload: list[tuple[str, float, int, float]] = []
        await mixed_load(s, 60.0, 5.0, overload)
        rss_after = rss_mib(s.epp.pid)
        calm: list[tuple[str, float, int, float]] = []
        await mixed_load(s, 4.0, 3.0, calm)

    critical = [o for o in overload if o[0] == "critical"]
    batch = [o for o in overload if o[0] == "batch"]
    assert all(status == 200 for _, _, status, _ in critical), {st for _, _, st, _ in critical}
    shed = [o for o in batch if o[2] == 429]
    assert len(shed) >= len(batch) // 4, f"only {len(shed)} of {len(batch)} sheddable requests shed"
    assert all(status in (200, 429) for _, _, status, _ in batch)
    latencies = sorted(lat for *_, lat in critical)
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"\noverload: {len(shed)}/{len(batch)} sheddable shed, {len(critical)} critical all 200, "
        f"critical p50 {statistics.median(latencies):.2f} s p99 {p99:.2f} s, "
        f"EPP RSS {rss_before:.0f} -> {rss_after:.0f} MiB"
    )
    assert p99 < 10.0, f"critical p99 {p99:.2f} s (median {statistics.median(latencies):.2f} s)"
    assert rss_after - rss_before < 100, f"EPP RSS grew {rss_after - rss_before:.0f} MiB"
    # recovered by itself: at a calm rate the late sheddable requests are served again
    late_batch = [o for o in calm if o[0] == "batch" and o[1] >= calm[0][1] + 1.5]
    assert late_batch and all(o[2] == 200 for o in late_batch), [o[2] for o in late_batch]
