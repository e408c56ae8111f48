"""Data-layer scrape cost: parse µs per page, and EPP CPU for 100 endpoints scraped every 50 ms.

    python -m bench.scrape [--quick] [--endpoints N] [--interval S] [--seconds S]

The model servers are one aiohttp process (a subprocess, so its CPU is not counted)
listening on N ports and serving a realistic vLLM /metrics page.  The EPP side is the
real thing: ``DataLayerRuntime`` + ``metrics-data-source`` + ``core-metrics-extractor``.
CPU is this process's utime+stime over the measured window, divided by wall time.  The
parse and extract shares are the CPU time spent in ``ExpositionParser.parse`` and
``CoreMetricsExtractor.extract`` (thread CPU time around each call, so time the process is
preempted does not count; the clock reads themselves, about 1 µs per scrape, land in the I/O
share); the rest of the CPU is I/O: the event loop, sockets, HTTP framing and the poll loops.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.api import EndpointMetadata, SourceBinding
from epp.datalayer.exposition import ExpositionParser
from epp.datalayer.extractors.core_metrics import CoreMetricsExtractor, CoreMetricsExtractorParams
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.sources.metrics_http import MetricsDataSource, MetricsDataSourceParams
from epp.datastore.store import Datastore
from epp.testing.plugins import FakeHandle

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "vllm-115-lines": ROOT / "tests/datalayer/data/vllm_small.txt",
    "vllm-451-lines": ROOT / "tests/datalayer/data/vllm_full.txt",
}
RESULTS = ROOT / "bench/results/scrape.json"
GOAL_CORES = 0.25
HEADLINE_PAGE = "vllm-451-lines"  # a real vLLM page: the goal is judged on it

_SERVER = r"""
import asyncio, sys
from aiohttp import web
body = open(sys.argv[1], "rb").read()
async def metrics(request):
    return web.Response(body=body, content_type="text/plain", charset="utf-8")
async def main():
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for _ in range(int(sys.argv[2])):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(",".join(map(str, ports)), flush=True)
    await asyncio.Event().wait()
try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
asyncio.run(main())
"""


def _best_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _client_parse(text: str) -> list[Any]:
    return list(text_string_to_metric_families(text))


def bench_parse(quick: bool) -> list[dict[str, Any]]:
    """Parse µs per page: our parser (the extractor's families) vs prometheus_client's parser."""
    extractor = CoreMetricsExtractor("core-metrics-extractor", CoreMetricsExtractorParams(), FakeHandle())
    ours = ExpositionParser(extractor.wanted_families())
    everything = ExpositionParser(None)
    rows = []
    for page, path in PAGES.items():
        body = path.read_bytes()
        text = body.decode()
        n = 200 if quick else 1000
        rows.append(
            {
                "page": page,
                "bytes": len(body),
                "ours_wanted_us": _best_us(partial(ours.parse, body), n, 5),
                "ours_all_families_us": _best_us(partial(everything.parse, body), max(n // 10, 10), 5),
                "prometheus_client_us": _best_us(partial(_client_parse, text), max(n // 50, 5), 3),
            }
        )
    return rows


class _TimedParser:
    """Wraps the source's parser, adding up the seconds spent parsing."""

    def __init__(self, inner: ExpositionParser) -> None:
        self.inner = inner
        self.wanted = inner.wanted
        self.seconds = 0.0

    def parse(self, data: bytes) -> Any:
        t0 = time.thread_time()
        try:
            return self.inner.parse(data)
        finally:
            self.seconds += time.thread_time() - t0


class _TimedExtractor(CoreMetricsExtractor):
    """The core extractor, adding up the seconds spent extracting."""

    seconds = 0.0

    def extract(self, data: Any, endpoint: Any) -> None:
        t0 = time.thread_time()
        try:
            super().extract(data, endpoint)
        finally:
            self.seconds += time.thread_time() - t0


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def _scrape_run(ports: list[int], interval: float, seconds: float, warmup: float) -> dict[str, Any]:
    ds = Datastore()
    handle = FakeHandle()
    source = MetricsDataSource("metrics-data-source", MetricsDataSourceParams(), handle)
    extractor = _TimedExtractor("core-metrics-extractor", CoreMetricsExtractorParams(), handle)
    runtime = DataLayerRuntime(ds, [SourceBinding(source, (extractor,))], refresh_interval=interval)
    parser = source._parser = _TimedParser(source._parser)  # type: ignore[assignment]
    for i, port in enumerate(ports):
        ds.upsert(EndpointMetadata(name=f"default/vllm-{i}-rank-0", address="127.0.0.1", port=port))
    async with runtime:
        await asyncio.sleep(warmup)
        eps = ds.endpoints()
        ticks0 = sum(s.ticks for ep in eps if (s := runtime.stats(ep)))
        fails0 = sum(s.failures for ep in eps if (s := runtime.stats(ep)))
        cpu0, wall0 = _cpu(), time.monotonic()
        parse0, extract0 = parser.seconds, extractor.seconds
        await asyncio.sleep(seconds)
        cpu1, wall1 = _cpu(), time.monotonic()
        parse_s, extract_s = parser.seconds - parse0, extractor.seconds - extract0
        ticks1 = sum(s.ticks for ep in eps if (s := runtime.stats(ep)))
        fails1 = sum(s.failures for ep in eps if (s := runtime.stats(ep)))
        skipped = sum(s.skipped for ep in eps if (s := runtime.stats(ep)))
        sample = eps[0].metrics
    wall = wall1 - wall0
    scrapes = ticks1 - ticks0
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    cpu = user + system
    return {
        "endpoints": len(ports),
        "interval_s": interval,
        "seconds": round(wall, 2),
        "scrapes_per_s": round(scrapes / wall, 1),
        "expected_scrapes_per_s": round(len(ports) / interval, 1),
        "failures": fails1 - fails0,
        "skipped_ticks": skipped,
        "cores": round(cpu / wall, 4),
        "user_cores": round(user / wall, 4),
        "sys_cores": round(system / wall, 4),
        "cpu_us_per_scrape": round(cpu / max(scrapes, 1) * 1e6, 1),
        "parse_cores": round(parse_s / wall, 4),
        "extract_cores": round(extract_s / wall, 4),
        "io_cores": round((cpu - parse_s - extract_s) / wall, 4),  # event loop, sockets, HTTP, poll loops
        "parse_share": round(parse_s / cpu, 3) if cpu else 0.0,
        "extract_share": round(extract_s / cpu, 3) if cpu else 0.0,
        "sample_metrics_ok": sample.waiting_queue_size == 3 and sample.update_time > 0,
    }


def bench_runtime(loop_kind: str, page: str, n: int, interval: float, seconds: float) -> dict[str, Any]:
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(PAGES[page]), str(n)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        ports = [int(p) for p in server.stdout.readline().strip().split(",")]
        runner: Callable[[Any], Any] = asyncio.run
        if loop_kind == "uvloop":
            import uvloop

            runner = uvloop.run
        gc.collect()
        result: dict[str, Any] = runner(_scrape_run(ports, interval, seconds, warmup=min(2.0, seconds / 2)))
    finally:
        server.kill()
        server.wait()
    return {"loop": loop_kind, "page": page, **result}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--endpoints", type=int, default=100)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--seconds", type=float, default=None, help="measured window per run")
    ap.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON results")
    args = ap.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 10.0)

    parse_rows = bench_parse(args.quick)
    print(f"\nparse µs per page (best of runs; python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(f"{'page':16} {'bytes':>7} {'ours':>9} {'ours(all)':>10} {'prom_client':>12} {'speed-up':>9}")
    for r in parse_rows:
        print(
            f"{r['page']:16} {r['bytes']:>7} {r['ours_wanted_us']:>9.1f} {r['ours_all_families_us']:>10.1f} "
            f"{r['prometheus_client_us']:>12.1f} {r['prometheus_client_us'] / r['ours_wanted_us']:>8.0f}x"
        )

    runs = []
    loops = ["asyncio", "uvloop"]
    pages = [HEADLINE_PAGE] if args.quick else list(PAGES)
    for page in pages:
        for loop_kind in loops:
            runs.append(bench_runtime(loop_kind, page, args.endpoints, args.interval, seconds))
    print(
        f"\nscraping {args.endpoints} endpoints every {args.interval * 1000:g} ms (goal ≤ {GOAL_CORES} core)"
    )
    print(
        f"{'loop':8} {'page':16} {'scrapes/s':>10} {'fail':>5} {'skip':>5} {'cores':>7} {'(user':>6} "
        f"{'sys)':>5} {'µs/scrape':>10} {'parse':>6} {'extract':>8} {'I/O':>6}"
    )
    for r in runs:
        print(
            f"{r['loop']:8} {r['page']:16} {r['scrapes_per_s']:>10} {r['failures']:>5} "
            f"{r['skipped_ticks']:>5} {r['cores']:>7.3f} {r['user_cores']:>6.3f} {r['sys_cores']:>5.3f} "
            f"{r['cpu_us_per_scrape']:>10.1f} {r['parse_share']:>6.0%} {r['extract_share']:>8.0%} "
            f"{1 - r['parse_share'] - r['extract_share']:>6.0%}"
        )
    headline = [r for r in runs if r["page"] == HEADLINE_PAGE]
    best = min(headline, key=lambda r: r["cores"])
    print(
        f"\nheadline ({HEADLINE_PAGE}, {best['loop']}): {best['cores']:.3f} core "
        f"(parse {best['parse_cores']:.3f}, extract {best['extract_cores']:.3f}, "
        f"I/O {best['io_cores']:.3f}); goal ≤ {GOAL_CORES}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "benchmark": "scrape",
                "mode": "quick" if args.quick else "full",
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "goal_cores": GOAL_CORES,
                "headline": {"page": HEADLINE_PAGE, **best},
                "parse": parse_rows,
                "runtime": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
