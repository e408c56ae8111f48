"""The simulator's own CPU cost: per request, per streamed token, and at 200 req/s over 8 replicas.

Runs `epp-sim --replicas 8` as a subprocess (time_scale 1, so the engine paces like a real GPU) and drives
it with an open-loop Poisson load generator in this process while scraping /metrics of every replica
every 50 ms, as the EPP does. The simulator's CPU time is read from /proc/<pid>/stat.

    python -m bench.sim_cost [--quick]     # prints a table, writes bench/results/sim_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

RESULTS = Path(__file__).parent / "results" / "sim_cost.json"
REPLICAS = 8
TARGET_RATE = 200.0
TARGET_CORES = 0.5
SCRAPE_INTERVAL_S = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    name: str
    rate: float  # requests per second (0: idle, scrapes only)
    max_tokens: int
    duration_s: float
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    scrapes: int = 0
    wall_s: float = 0.0
    sim_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)

    @property
    def sim_cores(self) -> float:
        return self.sim_cpu_s / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "ttft_ms"}
        data["sim_cores"] = round(self.sim_cores, 4)
        data["client_cores"] = round(self.client_cpu_s / self.wall_s, 4) if self.wall_s else 0.0
        data["achieved_rate"] = round(self.requests / self.wall_s, 1) if self.wall_s else 0.0
        data["tokens_per_s"] = round(self.tokens / self.wall_s, 1) if self.wall_s else 0.0
        if self.ttft_ms:
            ordered = sorted(self.ttft_ms)
            data["ttft_p50_ms"] = round(statistics.median(ordered), 2)
            data["ttft_p99_ms"] = round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)
        return data


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def start_simulator() -> tuple[asyncio.subprocess.Process, list[str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "epp_sim", "--replicas", str(REPLICAS), "--time-scale", "1", "--seed", "1",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    urls = []
    for _ in range(REPLICAS):
        record = json.loads(await asyncio.wait_for(process.stdout.readline(), 60))
        urls.append(f"http://{record['host']}:{record['port']}")
    return process, urls


async def one_request(http: aiohttp.ClientSession, url: str, prompt: str, phase: Phase) -> None:
    body = {
        "model": "mock-model",
        "prompt": prompt,
        "max_tokens": phase.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    try:
        async with http.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                phase.errors += 1
                await response.read()
                return
            async for line in response.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter()
                if line.startswith(b'data: {"id"') and b'"usage"' in line:
                    phase.tokens += json.loads(line[6:])["usage"]["completion_tokens"]
    except aiohttp.ClientError:
        phase.errors += 1
        return
    phase.requests += 1
    if first is not None:
        phase.ttft_ms.append((first - start) * 1000)


async def scraper(
    http: aiohttp.ClientSession, urls: list[str], phase_ref: list[Phase], stop: asyncio.Event
) -> None:
    """Scrape every replica's /metrics every 50 ms, like the EPP's data layer."""
    next_tick = time.perf_counter()
    while not stop.is_set():
        results = await asyncio.gather(*(scrape(http, u) for u in urls), return_exceptions=True)
        phase_ref[0].scrapes += sum(1 for r in results if r is True)
        next_tick += SCRAPE_INTERVAL_S
        await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))


async def scrape(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/metrics") as response:
        await response.read()
        return response.status == 200


async def run_phase(http: aiohttp.ClientSession, urls: list[str], pid: int, phase: Phase, seed: int) -> None:
    """Open loop: Poisson arrivals at `rate`, round-robin over replicas; CPU measured until all finish."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[None]] = []
    cpu0, client0, wall0 = process_cpu_s(pid), time.process_time(), time.perf_counter()
    if phase.rate > 0:
        t = 0.0
        i = 0
        while True:
            t += rng.expovariate(phase.rate)
            if t >= phase.duration_s:
                break
            await asyncio.sleep(max(0.0, wall0 + t - time.perf_counter()))
            prompt = f"request {seed}-{i} " + "lorem ipsum dolor sit amet " * 9  # ~64 tokens
            tasks.append(asyncio.create_task(one_request(http, urls[i % len(urls)], prompt, phase)))
            i += 1
        await asyncio.gather(*tasks)
    else:
        await asyncio.sleep(phase.duration_s)
    phase.wall_s = time.perf_counter() - wall0
    phase.sim_cpu_s = process_cpu_s(pid) - cpu0
    phase.client_cpu_s = time.process_time() - client0


def fit(idle: Phase, loaded: list[Phase]) -> tuple[float, float]:
    """Least squares over the loaded phases of cpu - idle_cores*wall = x*requests + y*tokens:
    (CPU seconds per request, CPU seconds per streamed token)."""
    srr = srt = stt = src = stc = 0.0
    for p in loaded:
        r, t, c = p.requests, p.tokens, p.sim_cpu_s - idle.sim_cores * p.wall_s
        srr, srt, stt, src, stc = srr + r * r, srt + r * t, stt + t * t, src + r * c, stc + t * c
    det = srr * stt - srt * srt
    if det == 0:
        return float("nan"), float("nan")
    return (src * stt - stc * srt) / det, (srr * stc - srt * src) / det


async def bench(quick: bool) -> dict[str, Any]:
    duration = 3.0 if quick else 10.0
    process, urls = await start_simulator()
    phases = [
        Phase("idle (scrapes only)", 0.0, 0, duration),
        Phase("1-token streams", TARGET_RATE, 1, duration),
        Phase("16-token streams", TARGET_RATE, 16, duration),
        Phase("128-token streams", TARGET_RATE / 4, 128, duration),
    ]
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            warm = Phase("warm-up", 50.0, 16, 2.0)
            current = [warm]
            stop = asyncio.Event()
            scraping = asyncio.create_task(scraper(http, urls, current, stop))
            await run_phase(http, urls, process.pid, warm, seed=0)
            for seed, phase in enumerate(phases, start=1):
                current[0] = phase
                await run_phase(http, urls, process.pid, phase, seed)
            stop.set()
            await scraping
    finally:
        process.terminate()
        await process.wait()
    idle, _, short, _ = phases
    per_request_s, per_token_s = fit(idle, phases[1:])
    return {
        "benchmark": "sim_cost",
        "mode": "quick" if quick else "full",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "replicas": REPLICAS,
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "phases": [p.summary() for p in phases],
        "cpu_us_per_request": round(per_request_s * 1e6, 1),
        "cpu_us_per_streamed_token": round(per_token_s * 1e6, 2),
        "idle_cores_with_scrapes": round(idle.sim_cores, 4),
        "target": {
            "rate": TARGET_RATE,
            "max_cores": TARGET_CORES,
            "sim_cores": round(short.sim_cores, 4),
            "achieved_rate": short.summary()["achieved_rate"],
            "errors": short.errors,
            "pass": short.sim_cores < TARGET_CORES and short.errors == 0,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    header = f"{'phase':<22}{'req/s':>8}{'tok/s':>9}{'errors':>8}{'scrapes':>9}{'sim cores':>11}{'client':>8}"
    header += f"{'ttft p50':>10}{'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for p in result["phases"]:
        print(
            f"{p['name']:<22}{p['achieved_rate']:>8}{p['tokens_per_s']:>9}{p['errors']:>8}{p['scrapes']:>9}"
            f"{p['sim_cores']:>11.3f}{p['client_cores']:>8.3f}{p.get('ttft_p50_ms', '-'):>10}"
            f"{p.get('ttft_p99_ms', '-'):>8}"
        )
    target = result["target"]
    print()
    print(f"simulator CPU per request:        {result['cpu_us_per_request']} us")
    print(f"simulator CPU per streamed token: {result['cpu_us_per_streamed_token']} us")
    print(f"idle cost (8 replicas scraped every 50 ms): {result['idle_cores_with_scrapes']:.3f} cores")
    verdict = "PASS" if target["pass"] else "FAIL"
    print(
        f"{verdict}: {REPLICAS} replicas at {target['achieved_rate']} req/s of 16-token streams use "
        f"{target['sim_cores']:.3f} cores (target < {TARGET_CORES})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 s per phase instead of 10 s")
    args = parser.parse_args()
    try:
        import uvloop  # why: the load generator should cost as little CPU as it can

        result = uvloop.run(bench(args.quick))
    except ImportError:
        result = asyncio.run(bench(args.quick))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
