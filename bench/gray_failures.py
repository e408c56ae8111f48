"""Gray failures through a real Envoy: how fast a faulty replica stops receiving requests.

Run ``python -m bench.gray_failures [--quick]``; prints a table and writes
bench/results/gray_failures.json.

Four ``epp-sim`` replicas, each its own process (so one can be SIGSTOPped), behind the EPP
(GIE's default scorers plus ``endpoint-health-scorer``) and Envoy; 50 streamed requests a second,
open loop.  After a warm-up, each fault is injected into the replica that served the most
requests in the last second (the favoured one), on a fresh stack: crash, hang (SIGSTOP),
metrics-only hang, inference-only hang, 500s, 10x slowdown, and a busy-but-healthy replica
(saturated by traffic from elsewhere).  A fault-free run gives the reference TTFT.

Per fault: the time from the fault to the last request the replica received before a gap of
``GAP`` seconds (after that it gets at most probes: one request per probe period), the
requests sent after that time that failed, the TTFT p99 of those against the fault-free p99,
and false ejections (ejections of any replica but a faulty one; for the busy replica, of any).
A request that got no answer counts as the faulty replica's: the others do not fail.
Goals (issue 29): <= 300 ms and <= 0.5% failed for crash, hang and 500s; <= 1 s and TTFT p99
<= 1.5x fault-free for the slowdown; no false ejection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common import ROOT, log, rnd, write_result
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

RATE = 50.0
REPLICAS = 4
GAP = 0.5  # seconds without a request to the faulty replica that end its share
SIM = ("--seed", "7", "--max-model-len", "131072", "--time-scale", "1.0")
CONFIG = ROOT / "config" / "examples" / "endpoint-health.yaml"  # GIE's scorers + endpoint-health-scorer
FAULTS = ("none", "crash", "hang", "metrics-hang", "inference-hang", "500s", "slowdown-10x", "busy")
GOALS: dict[str, tuple[float, float]] = {  # fault -> (seconds to lose its share, failed share after)
    "crash": (0.3, 0.005),
    "hang": (0.3, 0.005),
    "500s": (0.3, 0.005),
    "slowdown-10x": (1.0, 0.005),
}


@dataclass
class Sent:
    at: float
    status: int = -1  # -1: no answer in time
    port: str = ""
    ttft: float = 0.0


@dataclass
class Run:
    sims: list[SimFleet]
    epp: EppProcess
    envoy: Envoy
    http: aiohttp.ClientSession
    sent: list[Sent] = field(default_factory=list)

    def port(self, i: int) -> str:
        return str(self.sims[i].ports[0])

    async def fault(self, i: int, **faults: Any) -> None:
        with contextlib.suppress(aiohttp.ServerDisconnectedError):  # a crash drops this connection too
            async with self.http.post(f"http://127.0.0.1:{self.port(i)}/sim/faults", json=faults) as r:
                await r.read()

    async def one(self, i: int) -> None:
        s = Sent(time.monotonic())
        self.sent.append(s)
        body = {"model": "mock-model", "prompt": f"gray failure {i}", "max_tokens": 8, "stream": True}
        try:
            async with (
                asyncio.timeout(3.0),
                self.http.post(self.envoy.url + "/v1/completions", json=body) as r,
            ):
                async for _ in r.content.iter_any():
                    s.ttft = s.ttft or time.monotonic() - s.at
                s.status, s.port = r.status, r.headers.get("x-inference-port", "")
        except (TimeoutError, aiohttp.ClientError):
            pass

    async def load(self, seconds: float) -> None:
        tasks = []
        start = time.monotonic()
        i = 0
        while (now := time.monotonic()) - start < seconds:
            tasks.append(asyncio.create_task(self.one(i)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / RATE - now))  # pacing: open-loop arrivals
        await asyncio.gather(*tasks)

    async def transitions(self) -> dict[str, dict[str, float]]:
        """``epp_endpoint_health_transitions_total`` per endpoint (ip:port), by "state/reason"."""
        async with self.http.get(f"http://127.0.0.1:{self.epp.metrics_port}/metrics") as r:
            text = await r.text()
        out: dict[str, dict[str, float]] = {}
        for line in text.splitlines():
            if line.startswith("epp_endpoint_health_transitions_total{"):
                labels = dict(
                    p.split("=", 1) for p in line[line.index("{") + 1 : line.rindex("}")].split(",")
                )
                endpoint, state, reason = (labels[k].strip('"') for k in ("endpoint", "state", "reason"))
                moves = out.setdefault(endpoint, {})
                moves[f"{state}/{reason}"] = moves.get(f"{state}/{reason}", 0.0) + float(
                    line.rsplit(" ", 1)[1]
                )
        return out


@contextlib.asynccontextmanager
async def stack() -> Any:
    async with contextlib.AsyncExitStack() as es:
        sims = [await es.enter_async_context(SimFleet(1, *SIM)) for _ in range(REPLICAS)]
        eps = ",".join(s.hostports[0] for s in sims)
        epp = await es.enter_async_context(
            EppProcess(f"--endpoints={eps}", f"--config-file={CONFIG}", "--bind-address=127.0.0.1")
        )
        envoy = await es.enter_async_context(Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)))
        http = await es.enter_async_context(aiohttp.ClientSession())
        run = Run(sims, epp, envoy, http)
        try:
            yield run
        finally:
            for s in sims:
                await s.signal(signal.SIGCONT)


def _injector(
    run: Run, fault: str, target: int, hogs: list[asyncio.Task[None]]
) -> Callable[[], Awaitable[None]]:
    async def busy() -> None:
        url = f"http://127.0.0.1:{run.port(target)}/v1/completions"
        hog_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def hog(i: int) -> None:
            body = {"model": "mock-model", "prompt": f"hog {i} " * 50, "max_tokens": 400, "ignore_eos": True}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(30), hog_http.post(url, json=body) as r:
                    await r.read()

        async def all_hogs() -> None:
            try:
                await asyncio.gather(*(hog(i) for i in range(150)))
            finally:
                await hog_http.close()

        hogs.append(asyncio.create_task(all_hogs()))

    actions: dict[str, Callable[[], Awaitable[None]]] = {
        "none": lambda: asyncio.sleep(0),
        "crash": lambda: run.fault(target, crashed=True),
        "hang": lambda: run.sims[target].signal(signal.SIGSTOP),
        "metrics-hang": lambda: run.fault(target, metrics_stall=True),
        "inference-hang": lambda: run.fault(target, inference_stall=True),
        "500s": lambda: run.fault(target, error_rate=1.0),
        "slowdown-10x": lambda: run.fault(target, slowdown=10.0),
        "busy": busy,
    }
    return actions[fault]


def _p99(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100)[98]


async def scenario(fault: str, warm: float, after: float) -> dict[str, Any]:
    hogs: list[asyncio.Task[None]] = []
    async with stack() as run:
        load = asyncio.create_task(run.load(warm + after))
        await asyncio.sleep(warm)  # warm-up: the scenario's time, not a synchronisation
        t_fault = time.monotonic()
        recent = [s.port for s in run.sent if s.at > t_fault - 1.0 and s.port]
        ports = [run.port(i) for i in range(REPLICAS)]
        target = max(range(REPLICAS), key=lambda i: recent.count(ports[i]))
        await _injector(run, fault, target, hogs)()
        await load
        moves = await run.transitions()
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
    bad = ports[target]
    hits = sorted(s.at - t_fault for s in run.sent if s.at >= t_fault and (s.port == bad or s.status != 200))
    lost = 0.0
    for prev, nxt in zip([0.0, *hits], [*hits, after], strict=True):
        if nxt - prev >= GAP:
            lost = prev
            break
    settled = [s for s in run.sent if s.at > t_fault + lost and s.at < t_fault + after - 0.5]
    failed = sum(s.status != 200 for s in settled)
    ttfts = [s.ttft for s in settled if s.status == 200]
    before = [s for s in run.sent if s.at < t_fault]
    share_before = sum(s.port == bad for s in before) / max(1, len(before))
    ejections = {ep: sum(v for k, v in m.items() if k.startswith("ejected/")) for ep, m in moves.items()}
    false = sum(v for k, v in ejections.items() if k != f"127.0.0.1:{bad}" or fault in ("busy", "none"))
    return {
        "fault": fault,
        "replica": target,
        "share_before": rnd(share_before, 3),
        "lost_share_after_s": None if fault in ("none",) else rnd(lost, 3),
        "requests_after": len(settled),
        "failed_after": failed,
        "failed_share": rnd(failed / max(1, len(settled)), 4),
        "failed_since_fault": sum(s.status != 200 for s in run.sent if s.at >= t_fault),
        "ttft_p99_ms": rnd((_p99(ttfts) or 0.0) * 1000, 1),
        "transitions": moves,
        "false_ejections": false,
    }


async def main_async(quick: bool) -> dict[str, Any]:
    warm, after = (1.5, 3.0) if quick else (4.0, 8.0)
    rows = []
    for fault in FAULTS:
        log(f"gray_failures: {fault}")
        rows.append(await scenario(fault, warm, after))
    base = rows[0]["ttft_p99_ms"] or 0.0
    for r in rows:
        r["ttft_p99_vs_fault_free"] = rnd(r["ttft_p99_ms"] / base, 2) if base and r["ttft_p99_ms"] else None
        goal = GOALS.get(r["fault"])
        r["goal_met"] = (
            None
            if goal is None
            else (r["lost_share_after_s"] is not None and r["lost_share_after_s"] <= goal[0])
            and r["failed_share"] <= goal[1]
            and r["false_ejections"] == 0
            and (r["fault"] != "slowdown-10x" or (r["ttft_p99_vs_fault_free"] or 99.0) <= 1.5)
        )
    return {"rate": RATE, "replicas": REPLICAS, "warm_s": warm, "after_s": after, "gap_s": GAP, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.gray_failures", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    doc = asyncio.run(main_async(args.quick))
    head = ("fault", "share", "lost after", "failed", "TTFT p99", "vs ok", "false ej")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (15, 6, 11, 10, 10, 6, 9), strict=True)), "goal")
    for r in doc["rows"]:
        lost = "-" if r["lost_share_after_s"] is None else f"{r['lost_share_after_s'] * 1000:.0f} ms"
        print(
            f"{r['fault']:>15} {r['share_before']:>6.0%} {lost:>11} "
            f"{r['failed_after']:>4}/{r['requests_after']:<5} {r['ttft_p99_ms']:>7} ms "
            f"{r['ttft_p99_vs_fault_free'] or '-':>6} {r['false_ejections']:>9} "
            f"{'-' if r['goal_met'] is None else 'met' if r['goal_met'] else 'MISSED'}"
        )
    with contextlib.suppress(OSError):
        write_result("gray_failures", doc, mode="quick" if args.quick else "full", seeds={"sim": 7})


if __name__ == "__main__":
    main()
