"""Scheduler micro-benchmark: default profile + prefix producer at 10/100/1000 endpoints.

Run ``python -m bench.scheduler [--quick]``; prints a table and writes bench/results/scheduler.json.
Wall-clock p50/p99 per step, plus the thread CPU time of prepare + schedule (less noisy on a
shared machine).  Profile: queue-scorer (w2) + kv-cache-utilization-scorer (w2) +
prefix-cache-scorer (w3) and max-score-picker under single-profile-handler; the
approx-prefix-cache-producer's prepare step (hashing + index walk) is timed separately and as
part of the total.  Prompts are chat bodies whose first half is one of a few shared system
prompts, so the index has real matches.

The profile reuses the metrics-only scores (queue, KV cache) while the endpoints' ``Metrics``
objects are unchanged, as they are in the main cells, and recomputes only the endpoints whose
reading changed.  The ``fresh`` cells give endpoints a new reading with new values (queue
random walk, new KV usage) before each request, outside the timed window, round-robin as the
scrape loop does: ``n * 20 / rps`` endpoints per request is 50 ms scrapes at ``rps`` requests
per second (2 of 100 at 1000 rps, 10 at 200 rps), and ``all`` is every endpoint before every
request (the worst case: a fleet scraped faster than it is asked).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.director.prefix.hashing import hash_request
from epp.director.prefix.index import PrefixIndex
from epp.director.producers.approx_prefix import ApproxPrefixCacheParams, ApproxPrefixCacheProducer
from epp.plugin.base import NoParams
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest, RequestBody
from epp.scheduling.api import Scorer
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.picking import PickerParams
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer, PrefixCacheScorerParams
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.plugins import FakeHandle

RESULTS = Path(__file__).parent / "results" / "scheduler.json"
ENDPOINTS = (10, 100, 1000)
PROMPT_CHARS = (1_000, 10_000, 100_000)
SCRAPE_INTERVAL_S = 0.05
FRESH_RPS = (1000, 200)  # request rates of the fresh cells; plus "all"
GOALS = {
    "schedule_p50_us_100_endpoints_fresh_1000rps": 28.0,  # the Go EPP's published figure
    "p50_us_100_endpoints_10k_prompt": 100.0,
    "p50_us_1000_endpoints": 1000.0,
    "hash_100k_chars_us": 1000.0,
}


def _endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    now = time.monotonic()
    out = []
    for i in range(n):
        md = EndpointMetadata(
            name=f"bench/pod-{i}-rank-0",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            port=8000,
            pod_name=f"pod-{i}",
            namespace="bench",
        )
        m = Metrics(
            waiting_queue_size=rng.randrange(0, 20),
            kv_cache_usage_percent=rng.random(),
            running_requests_size=rng.randrange(0, 50),
            cache_block_size=16,
            update_time=now,
        )
        out.append(Endpoint(md, m))
    return out


def _chat(chars: int, system: str, rng: random.Random) -> InferenceRequest:
    question = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz") for _ in range(max(chars - len(system), 1)))
    body = RequestBody(
        api=ApiKind.CHAT_COMPLETIONS,
        raw=b"",
        json={
            "model": "bench-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        },
    )
    return InferenceRequest(request_id="bench", headers={}, body=body, target_model="bench-model")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _stats(samples: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"p50": round(statistics.median(us), 1), "p99": round(_pct(us, 0.99), 1)}


def _build(producer: ApproxPrefixCacheProducer) -> Scheduler:
    h = FakeHandle()
    scorers: list[tuple[Scorer, float]] = [
        (QueueScorer("queue-scorer", NoParams(), h), 2.0),
        (KVCacheUtilizationScorer("kv-cache-utilization-scorer", NoParams(), h), 2.0),
        (PrefixCacheScorer("prefix-cache-scorer", PrefixCacheScorerParams(), h), 3.0),
    ]
    picker = MaxScorePicker("max-score-picker", PickerParams(), h)
    profile = SchedulerProfile("default", filters=[], scorers=scorers, picker=picker)
    return Scheduler(SingleProfileHandler("single-profile-handler", NoParams(), h), [profile])


def _rescrape(eps: list[Endpoint], start: int, count: int, rng: random.Random) -> int:
    """``count`` endpoints from ``start`` (round-robin) get a new reading with new values; the next start."""
    n = len(eps)
    for j in range(start, start + count):
        ep = eps[j % n]
        m = ep.metrics
        ep.metrics = Metrics(
            waiting_queue_size=max(0, m.waiting_queue_size + rng.choice((-1, 0, 1))),
            kv_cache_usage_percent=rng.random(),
            running_requests_size=m.running_requests_size,
            cache_block_size=m.cache_block_size,
            update_time=m.update_time + SCRAPE_INTERVAL_S,
        )
    return (start + count) % n


def churn(n_endpoints: int, rps: int) -> int:
    """Endpoints with a new reading between two requests: 50 ms scrapes at ``rps`` requests/s."""
    return max(1, round(n_endpoints / (rps * SCRAPE_INTERVAL_S)))


def bench_cell(n_endpoints: int, chars: int, iterations: int, seed: int, *, fresh: int = 0) -> dict[str, Any]:
    """Time prepare (producer), schedule and pre-request for one endpoint count and prompt size.

    ``fresh``: how many endpoints get a new reading before each request (untimed).
    """
    rng = random.Random(seed)
    eps = _endpoints(n_endpoints, rng)
    candidates = tuple(eps)  # as the director hands them over: the datastore's snapshot tuple
    producer = ApproxPrefixCacheProducer(
        "approx-prefix-cache-producer", ApproxPrefixCacheParams(), FakeHandle()
    )
    scheduler = _build(producer)
    systems = ["".join(rng.choice("ABCDEFGHIJ ") for _ in range(chars // 2)) for _ in range(8)]
    requests = [_chat(chars, systems[i % len(systems)], rng) for i in range(64)]
    warmup = max(iterations // 4, 50)
    prep: list[float] = []
    sched: list[float] = []
    pre: list[float] = []
    total: list[float] = []
    cpu: list[float] = []
    store: list[float] = []  # wall time per stored sample (making the Metrics, assigning it)
    store_cpu: list[float] = []  # thread CPU time of the request's samples, all of them
    gc.collect()
    perf = time.perf_counter
    thread_time = time.thread_time
    start = 0
    for i in range(warmup + iterations):
        req = requests[i % len(requests)]
        s0 = thread_time()
        w0 = perf()
        if fresh:
            start = _rescrape(eps, start, fresh, rng)
        w1 = perf()
        s1 = thread_time()
        state = CycleState()
        c0 = thread_time()
        t0 = perf()
        producer.prepare(state, req, candidates)
        t1 = perf()
        result = scheduler.schedule(state, req, candidates)
        t2 = perf()
        c1 = thread_time()
        producer.pre_request(state, req, result)
        t3 = perf()
        if i >= warmup:
            prep.append(t1 - t0)
            sched.append(t2 - t1)
            pre.append(t3 - t2)
            total.append(t2 - t0)
            cpu.append(c1 - c0)
            if fresh:
                store.append((w1 - w0) / fresh)
                store_cpu.append(s1 - s0)
    out: dict[str, Any] = {
        "endpoints": n_endpoints,
        "prompt_chars": chars,
        "fresh_endpoints_per_request": fresh,
        "iterations": iterations,
        "prepare_us": _stats(prep),
        "schedule_us": _stats(sched),
        "total_us": _stats(total),
        "total_cpu_us": _stats(cpu),  # thread CPU time: robust when the machine is shared
        "pre_request_us": _stats(pre),
        "index_entries": len(producer.index),
    }
    if fresh:
        # What storing samples costs the scrape side (a new Metrics, the assignment, and what
        # the scheduler does on arrival), and the thread CPU of samples + prepare + schedule
        # per request: times the request rate, the event loop's CPU per second for both.
        out["store_us_per_sample"] = _stats(store)
        out["store_us_per_sample"]["mean"] = round(statistics.fmean(store) * 1e6, 2)
        per_request = [a + b for a, b in zip(store_cpu, cpu, strict=True)]
        out["cpu_us_per_request_with_samples"] = {
            **_stats(per_request),
            "mean": round(statistics.fmean(per_request) * 1e6, 1),
        }
    return out


def bench_hashing(iterations: int) -> dict[str, Any]:
    """Hash a 100k-character chat prompt: with the default 256-block cap and uncapped."""
    rng = random.Random(7)
    req = _chat(100_000, "", rng)
    out: dict[str, Any] = {}
    for label, max_blocks in (("default_cap_256_blocks", 256), ("uncapped", 1 << 30)):
        samples = []
        hashes: list[int] = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            hashes = hash_request(req, 16, max_blocks)
            samples.append(time.perf_counter() - t0)
        out[label] = {"blocks": len(hashes), **_stats(samples)}
    return out


def bench_memory(n_endpoints: int, capacity: int) -> dict[str, Any]:
    """Fill every endpoint's LRU to capacity with distinct hashes (worst case) and measure the index."""
    rng = random.Random(11)
    index = PrefixIndex()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for i in range(n_endpoints):
        name = f"bench/pod-{i}-rank-0"
        remaining = capacity + 256  # overfill: evictions must keep the bound
        while remaining > 0:
            batch = [rng.getrandbits(64) for _ in range(min(256, remaining))]
            index.add(name, None, batch, capacity)
            remaining -= len(batch)
    fill_s = time.perf_counter() - t0
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    entries = len(index)
    assert entries == n_endpoints * capacity, (entries, n_endpoints * capacity)
    assert index.reverse_size == entries
    return {
        "endpoints": n_endpoints,
        "capacity_per_endpoint": capacity,
        "entries": entries,
        "reverse_index_hashes": index.reverse_size,
        "bytes": used,
        "mib": round(used / 2**20, 1),
        "bytes_per_entry": round(used / entries, 1),
        "fill_seconds_with_tracemalloc": round(fill_s, 2),
    }


def fresh_only(iterations: int) -> dict[str, Any]:
    """Schedule p50 at 100 endpoints with unchanged readings, then each fresh churn; store cost."""
    out: dict[str, Any] = {}
    for label, count in [
        ("unchanged", 0),
        *((f"{rps} rps", churn(100, rps)) for rps in FRESH_RPS),
        ("all", 100),
    ]:
        c = bench_cell(100, 1_000, iterations, seed=100 * 31 + 7, fresh=count)
        out[label] = {"schedule_p50": c["schedule_us"]["p50"]}
        if count:
            out[label]["store_us_per_sample_mean"] = c["store_us_per_sample"]["mean"]
            out[label]["cpu_us_per_request_mean"] = c["cpu_us_per_request_with_samples"]["mean"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scheduler", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations and a 1/10 memory fill")
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument(
        "--fresh-only",
        action="store_true",
        help="only the 100-endpoint 1k-prompt cells (unchanged and fresh) as one JSON line: for"
        " alternating runs against a base commit's source (PYTHONPATH=<base>/src)",
    )
    args = ap.parse_args(argv)
    iterations = 200 if args.quick else 2000
    if args.fresh_only:
        print(json.dumps(fresh_only(iterations)))
        return 0
    capacity = 3125 if args.quick else 31250

    cells = []
    print(f"{'endpoints':>9} {'prompt':>7} | {'prepare p50/p99':>17} | {'schedule p50/p99':>17} |"
          f" {'total p50/p99':>17} | {'cpu p50':>8} | {'pre-req p50':>11}")  # fmt: skip
    for n in ENDPOINTS:
        for chars in PROMPT_CHARS:
            c = bench_cell(
                n, chars, iterations if n < 1000 else max(iterations // 2, 100), seed=n * 31 + chars
            )
            cells.append(c)
            prep, sched, total = c["prepare_us"], c["schedule_us"], c["total_us"]
            print(
                f"{n:>9} {chars:>7} | {prep['p50']:>8.1f}/{prep['p99']:<8.1f} |"
                f" {sched['p50']:>8.1f}/{sched['p99']:<8.1f} |"
                f" {total['p50']:>8.1f}/{total['p99']:<8.1f} | {c['total_cpu_us']['p50']:>8.1f} |"
                f" {c['pre_request_us']['p50']:>11.1f}"
            )
    fresh_cells = []
    for n in ENDPOINTS:
        for label, count in [*((f"{rps} rps", churn(n, rps)) for rps in FRESH_RPS), ("all", n)]:
            c = bench_cell(
                n, 1_000, iterations if n < 1000 else max(iterations // 2, 100), seed=n * 31 + 7, fresh=count
            )
            c["fresh_label"] = label
            fresh_cells.append(c)
            sched, store = c["schedule_us"], c["store_us_per_sample"]
            print(f"{n:>9} {1000:>7} | fresh metrics, {count:>4} endpoints/request ({label:>8}):"
                  f" schedule p50/p99 {sched['p50']:.1f}/{sched['p99']:.1f}"
                  f" | store/sample p50 {store['p50']:.1f} mean {store['mean']:.1f}"
                  f" | cpu/request incl. samples mean"
                  f" {c['cpu_us_per_request_with_samples']['mean']:.1f}")  # fmt: skip
    hashing = bench_hashing(100 if args.quick else 500)
    print(f"hash 100k chars: {json.dumps(hashing)}")
    memory = bench_memory(100, capacity)
    print(
        f"prefix index at 100 endpoints x {capacity}: {memory['mib']} MiB "
        f"({memory['bytes_per_entry']} B/entry, {memory['entries']} entries)"
    )

    def cell(n: int, chars: int) -> dict[str, Any]:
        return next(c for c in cells if c["endpoints"] == n and c["prompt_chars"] == chars)

    def fresh_cell(n: int, label: str) -> dict[str, Any]:
        return next(c for c in fresh_cells if c["endpoints"] == n and c["fresh_label"] == label)

    goals = {
        "schedule_p50_us_100_endpoints_fresh_1000rps": {
            "goal": GOALS["schedule_p50_us_100_endpoints_fresh_1000rps"],
            "fresh_1000rps": fresh_cell(100, "1000 rps")["schedule_us"]["p50"],
            "fresh_200rps": fresh_cell(100, "200 rps")["schedule_us"]["p50"],
            "fresh_all": fresh_cell(100, "all")["schedule_us"]["p50"],
            "unchanged": cell(100, 1_000)["schedule_us"]["p50"],
            "store_us_per_sample_1000rps": fresh_cell(100, "1000 rps")["store_us_per_sample"]["mean"],
            # 100 endpoints scraped 20 times a second (2 samples per request) and 1000 requests/s
            # (µs of CPU per request, samples included, x 1000 requests/s = that many ms per s)
            "cpu_ms_per_s_1000rps": fresh_cell(100, "1000 rps")["cpu_us_per_request_with_samples"]["mean"],
        },
        "p50_us_100_endpoints_10k_prompt": {
            "goal": GOALS["p50_us_100_endpoints_10k_prompt"],
            "schedule": cell(100, 10_000)["schedule_us"]["p50"],
            "total_with_prepare": cell(100, 10_000)["total_us"]["p50"],
            "total_cpu_with_prepare": cell(100, 10_000)["total_cpu_us"]["p50"],
        },
        "p50_us_1000_endpoints": {
            "goal": GOALS["p50_us_1000_endpoints"],
            "worst_total": max(cell(1000, c)["total_us"]["p50"] for c in PROMPT_CHARS),
            "worst_total_cpu": max(cell(1000, c)["total_cpu_us"]["p50"] for c in PROMPT_CHARS),
        },
        "hash_100k_chars_us": {
            "goal": GOALS["hash_100k_chars_us"],
            "capped_p50": hashing["default_cap_256_blocks"]["p50"],
            "uncapped_p50": hashing["uncapped"]["p50"],
        },
    }
    doc = {
        "benchmark": "scheduler",
        "mode": "quick" if args.quick else "full",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "profile": "queue w2 + kv-cache w2 + prefix w3, max-score-picker, approx-prefix-cache-producer",
        "cells": cells,
        "fresh_cells": fresh_cells,
        "hashing_100k_chars": hashing,
        "prefix_index_memory": memory,
        "goals": goals,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"goals: {json.dumps(goals)}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
