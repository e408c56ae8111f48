"""``python -m epp_sim.demo`` (``make demo``): simulated vLLM replicas, the EPP and a real Envoy.

Runs the same shared-prefix workload twice on a fresh fleet each time: through Envoy + the
EPP (GIE's default config), then through Envoy's plain round robin, and prints per-replica
traffic, time to first token, latency, throughput and the fleet's prefix-cache hit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.loadgen import Summary, run_open_loop, shared_prefix_jobs
from epp_sim.demo.procs import EppProcess, SimFleet

MODEL = "mock-model"


@dataclass(slots=True)
class Phase:
    name: str
    summary: Summary
    hit_rate: float


async def prefix_hit_rate(http: aiohttp.ClientSession, ports: Sequence[int]) -> float:
    """Fleet-wide prefix-cache hit rate from the replicas' own vLLM counters (tokens)."""
    hits = queries = 0.0
    for port in ports:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
        hits += _sum(text, "vllm:prefix_cache_hits_total")
        queries += _sum(text, "vllm:prefix_cache_queries_total")
    return hits / queries if queries else 0.0


def _sum(text: str, name: str) -> float:
    return sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M))


async def run_phase(name: str, args: argparse.Namespace, *, with_epp: bool) -> Phase:
    sim_args = [
        "--time-scale", str(args.time_scale), "--seed", "1", "--num-gpu-blocks", str(args.kv_blocks),
        "--model", MODEL, "--max-model-len", "32768",
    ]  # fmt: skip
    jobs = shared_prefix_jobs(
        groups=args.groups,
        prompts_per_group=args.requests // args.groups,
        system_chars=args.system_chars,
        question_chars=200,
        max_tokens=24,
        model=MODEL,
        seed=42,
    )
    print(f"  {name}: starting {args.replicas} simulated replicas ...", flush=True)
    async with SimFleet(args.replicas, *sim_args) as fleet, aiohttp.ClientSession() as http:
        if with_epp:
            epp = EppProcess(f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1")
            print("  starting the EPP and Envoy ...", flush=True)
            async with epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy:
                results, wall = await _drive(envoy.url, jobs, args, name)
        else:
            print("  starting Envoy (round robin, no EPP) ...", flush=True)
            async with Envoy(EnvoyConfig(upstreams=fleet.hostports)) as envoy:
                results, wall = await _drive(envoy.url, jobs, args, name)
        hit_rate = await prefix_hit_rate(http, fleet.ports)
    return Phase(name, Summary.of(results, wall), hit_rate)


async def _drive(url: str, jobs: Sequence[object], args: argparse.Namespace, name: str) -> tuple[list, float]:  # type: ignore[type-arg]
    print(
        f"  sending {len(jobs)} streamed chat requests at {args.rate:g}/s (Poisson, open loop) ...",
        flush=True,
    )
    return await run_open_loop(url, jobs, rate=args.rate, seed=7)  # type: ignore[arg-type]


def _ms(x: float) -> str:
    return f"{x * 1000:8.0f} ms"


def report(phases: Sequence[Phase]) -> None:
    print()
    print("Requests served per replica")
    for p in phases:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(p.summary.per_replica.items()))
        print(f"  {p.name:<22} {counts}")
    print()
    cols = (
        ("ok", 9),
        ("TTFT p50", 11),
        ("TTFT p90", 11),
        ("latency p50", 11),
        ("tok/s", 7),
        ("cache hits", 10),
    )
    header = f"  {'':<22} " + " ".join(f"{name:>{width}}" for name, width in cols)
    print(header)
    for p in phases:
        s = p.summary
        print(
            f"  {p.name:<22} {s.ok:>4}/{s.requests:<4} {_ms(s.ttft_p50):>11} {_ms(s.ttft_p90):>11} "
            f"{_ms(s.latency_p50):>11} {s.output_tokens_per_s:7.0f} {p.hit_rate:9.0%}"
        )
    if len(phases) == 2 and phases[1].summary.ttft_p90 > 0:
        a, b = phases[0].summary, phases[1].summary
        print()
        print(
            f"  EPP vs round robin: TTFT p90 x{a.ttft_p90 / b.ttft_p90:.2f}, "
            f"output tokens/s x{a.output_tokens_per_s / max(b.output_tokens_per_s, 1e-9):.2f}"
        )


async def main_async(args: argparse.Namespace) -> int:
    print("epp demo: a shared-prefix chat workload through Envoy, with and without the EPP")
    phases = [await run_phase("Envoy + EPP", args, with_epp=True)]
    if not args.no_compare:
        phases.append(await run_phase("Envoy round robin", args, with_epp=False))
    report(phases)
    ok = all(p.summary.ok == p.summary.requests for p in phases)
    print()
    print("demo finished: all requests succeeded" if ok else "demo finished: SOME REQUESTS FAILED")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epp_sim.demo", description=__doc__)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--groups", type=int, default=8, help="distinct shared system prompts")
    ap.add_argument("--system-chars", type=int, default=8000, help="length of each shared system prompt")
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second")
    ap.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per modelled second")
    ap.add_argument("--kv-blocks", type=int, default=800, help="KV cache blocks per replica (16 tokens each)")
    ap.add_argument("--no-compare", action="store_true", help="skip the round-robin comparison")
    args = ap.parse_args(argv)
    try:
        import uvloop

        return uvloop.run(main_async(args))
    except ImportError:  # pragma: no cover
        return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
