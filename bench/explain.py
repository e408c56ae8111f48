"""What explaining a decision costs the scheduler, off and on, measured in one run.

Run ``python -m bench.explain [--quick]``; prints a table and writes bench/results/explain.json.
The profile is bench/scheduler.py's (queue w2, KV cache w2, prefix cache w3, max-score picker)
at 10, 100 and 1000 endpoints.  Three variants are interleaved request by request, so machine
load hits them alike:

- ``off``: ``request.explain`` false, the path every request takes unless it asks;
- ``on``: the explained path (each filter's survivors, each scorer's weighted scores, the trace
  in the cycle state), what ``--explain-request-header`` / ``--emit-endpoint-scores`` cost;
- ``on+record``: ``on`` plus a ``Decision`` with stage marks added to a ``DecisionRing``
  (``--decisions-buffer-size``), without rendering it (JSON is made only when someone asks).

Thread CPU time per schedule call, p50 and p99, and the on/off ratios.  Also the memory blocks
a schedule call allocates, off and on (tracemalloc), to show that ``off`` allocates nothing for
explaining.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from typing import Any

from bench.common import log, write_result
from bench.scheduler import _build, _chat, _endpoints, _pct
from epp.director.producers.approx_prefix import ApproxPrefixCacheParams, ApproxPrefixCacheProducer
from epp.explain.record import Decision, DecisionRing
from epp.plugin.state import CycleState
from epp.testing.plugins import FakeHandle

ENDPOINTS = (10, 100, 1000)
VARIANTS = ("off", "on", "on+record")


def _us(samples: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"p50": round(statistics.median(us), 1), "p99": round(_pct(us, 0.99), 1)}


def bench_cell(n: int, iterations: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    eps = _endpoints(n, rng)
    scheduler = _build(ApproxPrefixCacheProducer("p", ApproxPrefixCacheParams(), FakeHandle()))
    system = "".join(rng.choice("ABCDEFGHIJ ") for _ in range(500))
    requests = [_chat(1000, system, rng) for _ in range(32)]
    ring = DecisionRing(1000)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    clock = time.thread_time
    warmup = max(iterations // 5, 20)
    for i in range(warmup + iterations):
        for variant in VARIANTS:
            req = requests[i % len(requests)]
            req.explain = variant != "off"
            state = CycleState()
            t0 = clock()
            if variant == "on+record":
                rec = Decision(req.request_id, 0.0)
                scheduler.schedule(state, req, eps)
                rec.mark("schedule")
                rec.candidates = eps
                ring.add(rec)
            else:
                scheduler.schedule(state, req, eps)
            if i >= warmup:
                samples[variant].append(clock() - t0)
    stats = {v: _us(s) for v, s in samples.items()}
    off = stats["off"]["p50"]
    return {
        "endpoints": n,
        "iterations": iterations,
        "cpu_us": stats,
        "ratio_on_to_off_p50": round(stats["on"]["p50"] / off, 2) if off else None,
        "ratio_record_to_off_p50": round(stats["on+record"]["p50"] / off, 2) if off else None,
        "allocated_blocks": _allocations(scheduler, eps, requests[0]),
    }


def _allocations(scheduler: Any, eps: Any, req: Any) -> dict[str, int]:
    """Memory blocks still held after one schedule call (the cycle state kept alive), off and on."""
    out = {}
    for variant in ("off", "on"):
        req.explain = variant == "on"
        scheduler.schedule(CycleState(), req, eps)  # warm caches (the metrics snapshot)
        tracemalloc.start()
        state = CycleState()
        before = tracemalloc.take_snapshot()
        scheduler.schedule(state, req, eps)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        out[variant] = sum(s.count_diff for s in after.compare_to(before, "filename") if s.count_diff > 0)
        del state
    req.explain = False
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.explain", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (numbers are noisier)")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    iterations = 200 if args.quick else 2000
    cells = []
    for n in ENDPOINTS:
        cell = bench_cell(n, iterations if n < 1000 else iterations // 4, args.seed)
        cells.append(cell)
        c = cell["cpu_us"]
        log(
            f"explain: {n:5d} endpoints  off p50 {c['off']['p50']:8.1f} us  on {c['on']['p50']:8.1f} us "
            f"(x{cell['ratio_on_to_off_p50']})  on+record {c['on+record']['p50']:8.1f} us "
            f"(x{cell['ratio_record_to_off_p50']})  blocks kept off/on {cell['allocated_blocks']}"
        )
    write_result(
        "explain", {"cells": cells}, mode="quick" if args.quick else "full", seeds={"seed": args.seed}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
