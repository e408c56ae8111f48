"""Comparison 1, routing quality: an llm-d-style shared-prefix workload over 8 simulated replicas.

    python -m bench.routing [--quick] [--loadgen builtin|inference-perf] [--rates 8,16]

Every (router, rate) cell gets a fresh ``epp-sim --replicas 8`` fleet (cold caches, same seed)
and the same request sequence: ``groups`` long shared system prompts, each followed by distinct
user questions, shuffled so groups interleave; Poisson arrivals.  The fleet's KV cache is sized
so that the working set (groups x system prompt tokens) exceeds the whole fleet's capacity: a
router that spreads a group over every replica makes each replica hold every group and thrash,
one that keeps a group on one replica hits its cache.  Routers: Envoy + EPP (GIE's default
config, and bench/configs/prefix-heavy.yaml), Envoy round robin (the in-run baseline),
vllm-router (cache_aware, power_of_two) and sglang-router (cache_aware) when installed.

Load: inference-perf (GIE's benchmark tool, its own venv; ``shared_prefix`` data, completions
API, streaming) when installed, else the project's open-loop generator (epp_sim.demo.loadgen;
streamed chat).  Reported per cell: TTFT p50/p90/p99, inter-token latency, output tokens/s,
success rate, and the fleet's prefix-cache hit rate from the replicas' own vLLM counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.common import (
    CONFIGS,
    CpuMeter,
    PeerRouter,
    PeerSpec,
    idle_cores,
    log,
    peer_installed,
    versions,
    write_result,
)
from bench.profiling import Profiler
from bench.setup import tokenizer_dir, venv_bin
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.loadgen import percentile, run_open_loop, shared_prefix_jobs
from epp_sim.demo.procs import EppProcess, SimFleet

MODEL = "mock-model"
SEEDS = {"sim": 1, "workload": 42, "arrivals": 7}
GOALS = {"ttft_p90_vs_rr": 0.1, "throughput_vs_rr": 2.0, "ttft_p90_vs_best_peer": 0.8}
CHARS_PER_SIM_TOKEN = 4  # the simulator's tokenizer (docs/simulator.md)
IDLE_WINDOW_S = 2.0


@dataclass(frozen=True, slots=True)
class Workload:
    replicas: int = 8
    groups: int = 96
    prompts_per_group: int = 12
    system_tokens: int = 6000  # simulator tokens (4 characters each)
    question_tokens: int = 600
    output_tokens: int = 64
    kv_blocks: int = 4000  # per replica, 16 tokens each
    block_size: int = 16
    time_scale: float = 1.0

    @property
    def working_set_tokens(self) -> int:
        return self.groups * self.system_tokens

    @property
    def fleet_kv_tokens(self) -> int:
        return self.replicas * self.kv_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class Settings:
    rates: tuple[float, ...]
    duration_s: int
    loadgen: str  # "builtin" | "inference-perf"
    profile_rate: float  # profile the EPP (default config) in this cell; 0: no profile


@dataclass(frozen=True, slots=True)
class Router:
    name: str
    label: str
    kind: str  # "epp" | "rr" | "peer"
    epp_config: str = ""
    peer: PeerSpec | None = None


ROUTERS = (
    Router("epp-default", "Envoy + EPP (default config)", "epp"),
    Router("epp-prefix", "Envoy + EPP (prefix-heavy config)", "epp", epp_config="prefix-heavy.yaml"),
    Router("round-robin", "Envoy round robin (no EPP)", "rr"),
    Router(
        "vllm-cache-aware", "vllm-router cache_aware", "peer", peer=PeerSpec("vllm-router", "cache_aware")
    ),
    Router(
        "vllm-power-of-two", "vllm-router power_of_two", "peer", peer=PeerSpec("vllm-router", "power_of_two")
    ),
    Router(
        "sglang-cache-aware",
        "sglang-router cache_aware",
        "peer",
        peer=PeerSpec("sglang-router", "cache_aware"),
    ),
)
BASELINE = "round-robin"
EPP_ROUTERS = ("epp-default", "epp-prefix")

QUICK = Settings(rates=(24.0,), duration_s=10, loadgen="builtin", profile_rate=0.0)
FULL = Settings(rates=(8.0, 16.0, 32.0, 48.0), duration_s=30, loadgen="inference-perf", profile_rate=32.0)


# ---------------------------------------------------------------------------------------------
# fleet metrics


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf)$", re.M)


async def fleet_counters(ports: Sequence[int]) -> dict[str, Any]:
    """Prefix-cache hits/queries (tokens), preemptions and finished requests, per replica and total."""
    names = (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
    )
    per: list[dict[str, float]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for port in ports:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
            row = dict.fromkeys(names, 0.0)
            for m in _SAMPLE.finditer(text):
                if m.group(1) in row:
                    row[m.group(1)] += float(m.group(3))
            per.append(row)
    hits = sum(r["vllm:prefix_cache_hits_total"] for r in per)
    queries = sum(r["vllm:prefix_cache_queries_total"] for r in per)
    finished = [r["vllm:request_success_total"] for r in per]
    mean = sum(finished) / len(finished) if finished else 0.0
    return {
        "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "preemptions": int(sum(r["vllm:num_preemptions_total"] for r in per)),
        "requests_per_replica": [int(x) for x in finished],
        "load_imbalance_max_over_mean": round(max(finished) / mean, 3) if mean else None,
        "prompt_tokens_per_request": round(
            sum(r["vllm:prompt_tokens_total"] for r in per) / max(1.0, sum(finished)), 1
        ),
    }


# ---------------------------------------------------------------------------------------------
# load generators


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x * 1000, 2)


async def builtin_load(url: str, wl: Workload, rate: float, duration: int) -> dict[str, Any]:
    """Streamed chat requests (epp_sim.demo.loadgen): the first ``rate x duration`` of one fixed sequence."""
    jobs = shared_prefix_jobs(
        groups=wl.groups,
        prompts_per_group=wl.prompts_per_group,
        system_chars=wl.system_tokens * CHARS_PER_SIM_TOKEN,
        question_chars=wl.question_tokens * CHARS_PER_SIM_TOKEN,
        max_tokens=wl.output_tokens,
        model=MODEL,
        seed=SEEDS["workload"],
    )
    n = max(1, round(rate * duration))
    seq = [jobs[i % len(jobs)] for i in range(n)]
    results, wall = await run_open_loop(url, seq, rate=rate, seed=SEEDS["arrivals"], timeout=600)
    ok = [r for r in results if r.status == 200 and not r.error and r.output_tokens > 0]
    ttft = [r.ttft for r in ok if r.ttft]
    itl = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft and r.output_tokens > 1]
    lat = [r.latency for r in ok]
    errors = Counter(r.error or f"HTTP {r.status}" for r in results if r not in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "success_rate": round(len(ok) / len(results), 4) if results else 0.0,
        "errors": dict(errors),
        "wall_s": round(wall, 2),
        "ttft_ms": {q: _ms(percentile(ttft, v)) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
        "itl_ms": {q: _ms(percentile(itl, v)) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))},
        "latency_ms": {q: _ms(percentile(lat, v)) for q, v in (("p50", 50), ("p90", 90))},
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / wall, 1) if wall else 0.0,
        "served_by": dict(Counter(r.served_by for r in ok)),
    }


async def iperf_load(url: str, wl: Workload, rate: float, duration: int) -> dict[str, Any]:
    """inference-perf: shared_prefix data, completions API, streamed; its JSON summary reduced."""
    exe = venv_bin("inference-perf", "inference-perf")
    tok = tokenizer_dir()
    assert exe is not None
    assert tok is not None
    with tempfile.TemporaryDirectory(prefix="bench-iperf-") as d:
        cfg = {
            "load": {
                "type": "constant",  # exponential gaps (Poisson arrivals), exactly rate x duration requests
                "stages": [{"rate": rate, "duration": duration}],
                "num_workers": 1,
                # inference-perf times a request from when it is sent; its default cap of 100 in-flight
                # requests per worker would hold requests back unseen when a router lets queues grow.
                "worker_max_concurrency": 4096,
                "base_seed": SEEDS["arrivals"],
            },
            "api": {"type": "completion", "streaming": True},
            "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(tok)},
            "data": {
                "type": "shared_prefix",
                "shared_prefix": {
                    "num_groups": wl.groups,
                    "num_prompts_per_group": wl.prompts_per_group,
                    # bench/setup.py's tokenizer has 4 characters per token, as the simulator
                    "system_prompt_len": wl.system_tokens,
                    "question_len": wl.question_tokens,
                    "output_len": wl.output_tokens,
                    "seed": SEEDS["workload"],
                },
            },
            "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": False}},
            "storage": {"local_storage": {"path": str(Path(d) / "out")}},
        }
        (Path(d) / "config.yaml").write_text(yaml.safe_dump(cfg))
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            str(exe),
            "-c",
            str(Path(d) / "config.yaml"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
            cwd=d,
        )
        _, err = await asyncio.wait_for(proc.communicate(), duration + 900)
        summary = Path(d) / "out" / "summary_lifecycle_metrics.json"
        if proc.returncode != 0 or not summary.exists():
            tail = err.decode(errors="replace")[-1500:]
            raise RuntimeError(f"inference-perf failed ({proc.returncode}): {tail}")
        data = json.loads(summary.read_text())
        wall = time.monotonic() - started
    return reduce_iperf(data, wall)


def reduce_iperf(data: dict[str, Any], wall: float) -> dict[str, Any]:
    """inference-perf's summary_lifecycle_metrics.json → the fields this report compares."""
    ok_n = int(data.get("successes", {}).get("count", 0) or 0)
    fail_n = int(data.get("failures", {}).get("count", 0) or 0)
    lat = data.get("successes", {}).get("latency", {})
    thr = data.get("successes", {}).get("throughput", {})

    def pct(block: str, key: str) -> float | None:
        v = (lat.get(block) or {}).get("median" if key == "p50" else key)  # its name for p50
        return None if v is None else round(float(v) * 1000, 2)

    total = ok_n + fail_n
    return {
        "requests": total,
        "ok": ok_n,
        "success_rate": round(ok_n / total, 4) if total else 0.0,
        "errors": {"failed": fail_n} if fail_n else {},
        "wall_s": round(wall, 2),
        "ttft_ms": {q: pct("time_to_first_token", q) for q in ("p50", "p90", "p99")},
        "itl_ms": {q: pct("inter_token_latency", q) for q in ("p50", "p90", "p99")},
        "latency_ms": {q: pct("request_latency", q) for q in ("p50", "p90")},
        "output_tokens_per_s": round(float(thr.get("output_tokens_per_sec", 0.0) or 0.0), 1),
        "requests_per_s": round(float(thr.get("requests_per_sec", 0.0) or 0.0), 2),
        "client_schedule_delay_ms": _delay_ms(data.get("load_summary", {}).get("schedule_delay")),
    }


def _delay_ms(block: Any) -> dict[str, float] | None:
    """How late inference-perf sent requests (its own lag), when it reports it."""
    if not isinstance(block, dict):
        return None
    return {k: round(float(v) * 1000, 2) for k, v in block.items() if k in ("mean", "p90", "p99", "max")}


# ---------------------------------------------------------------------------------------------
# one cell


def sim_args(wl: Workload) -> list[str]:
    return [
        "--time-scale",
        str(wl.time_scale),
        "--seed",
        str(SEEDS["sim"]),
        "--num-gpu-blocks",
        str(wl.kv_blocks),
        "--block-size",
        str(wl.block_size),
        "--model",
        MODEL,
        "--max-model-len",
        "32768",
    ]


async def run_cell(
    router: Router, rate: float, wl: Workload, st: Settings, *, profile: bool
) -> dict[str, Any]:
    load = iperf_load if st.loadgen == "inference-perf" else builtin_load
    cell: dict[str, Any] = {"router": router.name, "rate": rate}
    async with SimFleet(wl.replicas, *sim_args(wl)) as fleet:
        if router.kind == "epp":
            args = [f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1"]
            if router.epp_config:
                args.append(f"--config-file={CONFIGS / router.epp_config}")
            async with EppProcess(*args) as epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy:
                # The EPP's idle cost (metric scrapes of 8 replicas every 50 ms) is reported on its own.
                idle = (await idle_cores({"epp": {"epp": epp.pid}}, IDLE_WINDOW_S))["epp"]
                cell["epp_idle_cores"] = idle["epp"]
                meter = CpuMeter({"epp": epp.pid, "envoy": envoy.pid}, idle)
                meter.start()
                if profile:
                    async with Profiler(epp.pid, min(st.duration_s, 30)) as pr:
                        res = await load(envoy.url, wl, rate, st.duration_s)
                    cell["profile"] = pr.summary()
                else:
                    res = await load(envoy.url, wl, rate, st.duration_s)
                cell["router_cpu_s"] = {k: round(v, 2) for k, v in meter.stop().items()}
        elif router.kind == "rr":
            async with Envoy(EnvoyConfig(upstreams=fleet.hostports)) as envoy:
                meter = CpuMeter({"envoy": envoy.pid})
                meter.start()
                res = await load(envoy.url, wl, rate, st.duration_s)
                cell["router_cpu_s"] = {k: round(v, 2) for k, v in meter.stop().items()}
        else:
            assert router.peer is not None
            async with PeerRouter(router.peer, fleet.hostports) as peer:
                meter = CpuMeter({"router": peer.pid})
                meter.start()
                res = await load(peer.url, wl, rate, st.duration_s)
                cell["router_cpu_s"] = {k: round(v, 2) for k, v in meter.stop().items()}
        cell.update(res)
        cell["fleet"] = await fleet_counters(fleet.ports)
    return cell


# ---------------------------------------------------------------------------------------------
# the whole comparison


def derive(cells: list[dict[str, Any]], routers: Sequence[str]) -> dict[str, Any]:
    """Ratios to round robin and to the best peer, per rate and at the peak; the goals."""
    by = {(c["router"], c["rate"]): c for c in cells}
    rates = sorted({c["rate"] for c in cells})
    peers = [r for r in routers if r not in (*EPP_ROUTERS, BASELINE)]

    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    for r in routers:
        ratios[r] = {}
        for rate in rates:
            c, base = by.get((r, rate)), by.get((BASELINE, rate))
            peer_p90s = [v for v in (p90(by.get((p, rate))) for p in peers) if v]
            ratios[r][str(rate)] = {
                "ttft_p90_vs_rr": _ratio(p90(c), p90(base)),
                "throughput_vs_rr": _ratio(tput(c), tput(base)),
                "ttft_p90_vs_best_peer": _ratio(p90(c), min(peer_p90s)) if peer_p90s else None,
            }
    peak = {r: max(((tput(by.get((r, rate))) or 0.0) for rate in rates), default=0.0) for r in routers}
    top = max(rates) if rates else None
    goals: dict[str, Any] = {}
    for r in EPP_ROUTERS:
        if r not in routers or top is None:
            continue
        at_top = ratios[r][str(top)]
        peak_ratio = _ratio(peak[r], peak.get(BASELINE))
        goals[r] = {
            "at_rate": top,
            "ttft_p90_vs_rr": _goal(at_top["ttft_p90_vs_rr"], GOALS["ttft_p90_vs_rr"], lower=True),
            "peak_throughput_vs_rr": _goal(peak_ratio, GOALS["throughput_vs_rr"], lower=False),
            "ttft_p90_vs_best_peer": _goal(
                at_top["ttft_p90_vs_best_peer"], GOALS["ttft_p90_vs_best_peer"], lower=True
            ),
        }
    return {"ratios": ratios, "peak_output_tokens_per_s": peak, "goals": goals}


def p90(c: dict[str, Any] | None) -> float | None:
    """A cell's TTFT p90 (ms), None for a missing cell."""
    return None if c is None else c["ttft_ms"]["p90"]


def tput(c: dict[str, Any] | None) -> float | None:
    """A cell's output tokens per second, None for a missing cell."""
    return None if c is None else c["output_tokens_per_s"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _goal(value: float | None, goal: float, *, lower: bool) -> dict[str, Any]:
    met = value is not None and (value <= goal if lower else value >= goal)
    return {"goal": goal, "value": value, "met": met}


async def run(
    mode: str,
    *,
    loadgen: str | None = None,
    rates: Sequence[float] | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    st = QUICK if mode == "quick" else FULL
    wl = Workload()
    chosen = loadgen or st.loadgen
    notes: list[str] = []
    iperf_ready = venv_bin("inference-perf", "inference-perf") is not None and tokenizer_dir() is not None
    if chosen == "inference-perf" and not iperf_ready:
        notes.append("inference-perf not installed (python -m bench.setup): the project's generator was used")
        chosen = "builtin"
    st = Settings(
        rates=tuple(rates) if rates else st.rates,
        duration_s=st.duration_s,
        loadgen=chosen,
        profile_rate=st.profile_rate,
    )
    routers = []
    for r in ROUTERS:
        if only and r.name not in only:
            continue
        if r.peer is not None and not peer_installed(r.peer.tool):
            notes.append(f"{r.label}: not installed, skipped")
            continue
        routers.append(r)
    for n in notes:
        log(f"routing: {n}")
    log(
        f"routing: working set {wl.working_set_tokens:,} tokens ({wl.groups} groups x {wl.system_tokens}) vs "
        f"fleet KV {wl.fleet_kv_tokens:,} tokens ({wl.replicas} x {wl.kv_blocks} blocks x {wl.block_size}) "
        f"= {wl.working_set_tokens / wl.fleet_kv_tokens:.2f}x; load generator: {st.loadgen}"
    )
    cells: list[dict[str, Any]] = []
    for rate in st.rates:
        for router in routers:
            profile = router.name == "epp-default" and rate == st.profile_rate
            log(f"routing: {router.label} at {rate:g} req/s for {st.duration_s} s on a fresh fleet ...")
            try:
                cell = await run_cell(router, rate, wl, st, profile=profile)
            except (RuntimeError, OSError, TimeoutError) as e:
                log(f"routing: {router.label} at {rate:g} req/s FAILED: {e}")
                cells.append({"router": router.name, "rate": rate, "failed": str(e)[-800:]})
                continue
            cells.append(cell)
            log(
                f"routing: {router.name:<18} {rate:>4g} req/s  TTFT p50/p90 {cell['ttft_ms']['p50']}/"
                f"{cell['ttft_ms']['p90']} ms  ITL p50 {cell['itl_ms']['p50']} ms  "
                f"{cell['output_tokens_per_s']} tok/s  ok {cell['ok']}/{cell['requests']}  "
                f"cache hits {cell['fleet']['prefix_hit_rate']:.0%}"
            )
    good = [c for c in cells if "failed" not in c]
    return {
        "settings": asdict(st),
        "workload": {
            **asdict(wl),
            "working_set_tokens": wl.working_set_tokens,
            "fleet_kv_tokens": wl.fleet_kv_tokens,
            "working_set_over_fleet_kv": round(wl.working_set_tokens / wl.fleet_kv_tokens, 3),
            "working_set_over_replica_kv": round(wl.working_set_tokens / (wl.kv_blocks * wl.block_size), 2),
        },
        "routers": {r.name: r.label for r in routers},
        "baseline": BASELINE,
        "notes": notes,
        "cells": cells,
        "derived": derive(good, [r.name for r in routers]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--loadgen", choices=("builtin", "inference-perf"), default=None)
    ap.add_argument("--rates", default="", help="comma-separated request rates (overrides the mode's)")
    ap.add_argument(
        "--routers", default="", help="comma-separated subset: " + ", ".join(r.name for r in ROUTERS)
    )
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    rates = [float(x) for x in args.rates.split(",") if x.strip()] or None
    import uvloop

    only = [x.strip() for x in args.routers.split(",") if x.strip()]
    result = uvloop.run(run(mode, loadgen=args.loadgen, rates=rates, only=only))
    result["versions"] = versions()
    log(f"routing: wrote {write_result('routing', result, mode=mode, seeds=SEEDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
