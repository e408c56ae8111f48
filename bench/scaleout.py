"""Issue 30's measurements: active-active EPP replicas sharing routing state, and workers.

    python -m bench.scaleout [--quick] [--part quality,cost,workers,faults]

Part ``quality``: llm-d's shared-prefix profile (bench/prefix_routing's sizing) through one
Envoy whose ext_proc cluster holds 1, 2 or 4 EPP replicas (each stream goes to one replica,
round robin, so each replica sees its share of the traffic), with the approximate prefix
index (prefix-heavy.yaml).  Replicas either run independently (the baseline to beat: each
knows a 1/N share of the routing) or share their routing state (``--peers``).  Reported:
TTFT p90 and the fleet's prefix-cache hit rate; goal: 4 synced replicas within 5% of one.

Part ``cost``: N EPP replicas (N = 1, 2, 4, 8), each driven directly over ext_proc at the
same steady rate by this process (bench/extproc_client: pre-encoded frames, no Envoy), with
sync off and on.  Cost = replica 0's CPU (all its threads, libzmq's I/O thread included and
also reported apart; idle CPU subtracted) per request it routed.  Effective scaling =
N x cost(1, sync off) / cost(N, sync on); goals >= 3.8 at 4 and >= 7.2 at 8.  Staleness: the
p99 of ``epp_sync_delta_lag_seconds`` on replica 0 under that load — from the wall clock of
the first change a batch carries (the routing decision) to its application, so the sender's
coalescing wait and the receiver's read gap are in it; goal <= 10 ms.  Every cell runs
``COST_ROUNDS`` times, rounds interleaved, medians reported.  What this measures on this
machine: N replicas, their load client and the simulator share 2 cores, so context switches
and cache misses inflate every process's CPU per request as N grows, with or without sync;
``sync_off_vs_alone`` (sync off at N over one replica alone) shows how much, and
``sync_on_vs_off_same_n`` what the sync itself adds at the same crowding.  The goal's ratio
charges both to the sync.  At 60 req/s a replica's requests are 16.7 ms apart, more than the
staleness goal lets a batch wait, so each request is its own message (its release rides
along): each replica receives one message per peer per request.

Part ``workers``: ``epp --workers 1`` and ``--workers 2``, driven directly over ext_proc,
closed loop (the same streams in flight), several rounds alternating; goal: capacity >= 1.8x
at a p99 no worse.

Part ``faults``: three synced replicas behind Envoy (gRPC health checks every 0.2 s) under a
steady 50 req/s: one is SIGKILLed (requests that fail after Envoy's health check dropped it:
goal 0); it restarts and warm-starts from a peer (its first 100 requests' predicted prefix
hit ratio against its peers'); then a rolling update replaces every replica one by one
(start the new one, wait until ready, SIGTERM the old one): goal, no request lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench import extproc_client as xc
from bench.common import CONFIGS, cpu_seconds, log, rnd, write_result
from bench.prefix_routing import QUICK as PR_QUICK
from bench.prefix_routing import _shared
from bench.routing import MODEL, Workload, builtin_load, fleet_counters, sim_args
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

SEEDS = {"sim": 1, "workload": 42, "arrivals": 7}
GOALS = {
    "quality_ttft_p90_vs_one": 1.05,  # 4 synced replicas' TTFT p90 / one replica's, at most
    "quality_hit_rate_vs_one": 0.95,  # 4 synced replicas' hit rate / one replica's, at least
    "scaling_4": 3.8,
    "scaling_8": 7.2,
    "staleness_p99_ms": 10.0,
    "workers_2": 1.8,
    "faults_failed_after_drop": 0,
    "warm_hit_ratio_vs_peers": 0.95,
    "rolling_failed": 0,
}
CONFIG = CONFIGS / "prefix-heavy.yaml"
COST_ROUNDS = 3  # part cost: every cell this many times, rounds interleaved, medians reported


@dataclass(frozen=True, slots=True)
class Settings:
    quality_rate: float
    quality_duration_s: int
    quality_workload: Workload
    cost_ns: tuple[int, ...]
    cost_rate: float  # per replica
    cost_seconds: float
    workers_rounds: int
    workers_seconds: float
    faults_rate: float


FULL = Settings(24.0, 30, _shared(9600), (1, 2, 4, 8), 80.0, 20.0, 3, 10.0, 50.0)
QUICK = Settings(12.0, 10, PR_QUICK.profiles[0].workload, (1, 2, 4, 8), 60.0, 8.0, 2, 5.0, 50.0)


# ---------------------------------------------------------------------------------------------
# replicas


class Ports:
    """Ports for every process of a cell, below the kernel's ephemeral range (32768+): a port
    handed out now and bound seconds later (a rolling update's new replica) cannot have been
    taken meanwhile by an outgoing connection, and no two handed out here overlap."""

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self._rng = random.Random()

    def one(self, *, pair: bool = False) -> int:
        """A free port (``pair``: and its successor, the sync warm-start socket)."""
        for _ in range(1000):
            port = self._rng.randrange(20000, 32000)
            wanted = {port, port + 1} if pair else {port}
            if wanted & self.taken or not all(_free(p) for p in wanted):
                continue
            self.taken |= wanted
            return port
        raise RuntimeError("no free port below the ephemeral range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def epp(ports: Ports, *args: str) -> EppProcess:
    """An EppProcess on ports from ``ports``."""
    e = EppProcess(*args)
    e.grpc_port, e.health_port, e.metrics_port = ports.one(), ports.one(), ports.one()
    return e


def peer_args(i: int, peer_ports: Sequence[int]) -> list[str]:
    """The flags that make replica ``i`` of ``peer_ports`` an active-active peer of the others
    (a lone replica lists itself, which the EPP drops: its hub runs with no peers)."""
    others = [f"127.0.0.1:{p}" for j, p in enumerate(peer_ports) if j != i] or [f"127.0.0.1:{peer_ports[i]}"]
    return [
        f"--peer-port={peer_ports[i]}",
        f"--replica-id=bench-{i}",
        "--ha-enable-leader-election=false",
        f"--peers={','.join(others)}",
    ]


def replicas(n: int, endpoints: Sequence[str], *, sync: bool, config: Path | None = None) -> list[EppProcess]:
    pool = Ports()
    ports = [pool.one(pair=True) for _ in range(n)]
    out = []
    for i in range(n):
        args = [f"--endpoints={','.join(endpoints)}", "--bind-address=127.0.0.1"]
        if config is not None:
            args.append(f"--config-file={config}")
        if sync:
            args += peer_args(i, ports)
        out.append(epp(pool, *args))
    return out


async def start_all(epps: Sequence[EppProcess]) -> None:
    await asyncio.gather(*(e.start() for e in epps))


async def stop_all(epps: Sequence[EppProcess]) -> None:
    await asyncio.gather(*(e.stop() for e in epps), return_exceptions=True)


async def metrics_text(port: int) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as r,
    ):
        return await r.text()


_BUCKET = re.compile(r'^(\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\}\s+(\S+)$', re.M)
_SAMPLE = re.compile(r"^(\w+)(?:\{[^}]*\})?\s+(\S+)$", re.M)


def histogram_quantile(text: str, family: str, q: float) -> float | None:
    """Prometheus' histogram_quantile over every series of ``family`` (buckets summed)."""
    buckets: dict[float, float] = {}
    for m in _BUCKET.finditer(text):
        if m.group(1) == family:
            le = float("inf") if m.group(2) == "+Inf" else float(m.group(2))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(3))
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if b == float("inf"):
                return prev_bound
            return prev_bound + (b - prev_bound) * (rank - prev_count) / max(c - prev_count, 1e-12)
        prev_bound, prev_count = b, c
    return prev_bound


def sample_sum(text: str, family: str) -> float:
    return sum(float(m.group(2)) for m in _SAMPLE.finditer(text) if m.group(1) == family)


# ---------------------------------------------------------------------------------------------
# part: quality


async def quality_cell(n: int, sync: bool, st: Settings) -> dict[str, Any]:
    wl = st.quality_workload
    async with SimFleet(wl.replicas, *sim_args(wl)) as fleet:
        epps = replicas(n, fleet.hostports, sync=sync, config=CONFIG)
        await start_all(epps)
        try:
            cfg = EnvoyConfig(
                ext_proc_port=epps[0].grpc_port,
                ext_proc_replicas=[(e.grpc_port, e.health_port) for e in epps],
                ext_proc_health_service="readiness",
            )
            async with Envoy(cfg) as envoy:
                res = await builtin_load(envoy.url, wl, st.quality_rate, st.quality_duration_s)
            counters = await fleet_counters(fleet.ports)
        finally:
            await stop_all(epps)
    return {
        "replicas": n,
        "sync": sync,
        "ttft_p90_ms": res["ttft_ms"]["p90"],
        "success_rate": res["success_rate"],
        "prefix_hit_rate": counters["prefix_hit_rate"],
    }


async def quality(st: Settings) -> dict[str, Any]:
    cells = [await quality_cell(1, False, st)]
    for n in (2, 4):
        for sync in (False, True):
            cells.append(await quality_cell(n, sync, st))
            log(f"scaleout quality: {cells[-1]}")
    one = cells[0]
    four = next(c for c in cells if c["replicas"] == 4 and c["sync"])
    ttft = rnd(four["ttft_p90_ms"] / one["ttft_p90_ms"]) if one["ttft_p90_ms"] else None
    hits = rnd(four["prefix_hit_rate"] / one["prefix_hit_rate"]) if one["prefix_hit_rate"] else None
    return {
        "cells": cells,
        "ttft_p90_4_synced_vs_one": ttft,
        "hit_rate_4_synced_vs_one": hits,
        "met": {
            "ttft": ttft is not None and ttft <= GOALS["quality_ttft_p90_vs_one"],
            "hits": hits is not None and hits >= GOALS["quality_hit_rate_vs_one"],
        },
    }


# ---------------------------------------------------------------------------------------------
# part: cost and staleness


def prompts(n: int, seed: int) -> list[str]:
    """Prompts sharing a few long prefixes, so the prefix index inserts and matches as in service."""
    return [f"system prompt {g % 8} " * 40 + f"question {seed}-{g}" for g in range(n)]


def thread_cpu(pid: int, prefix: str) -> float:
    """CPU seconds of the threads of ``pid`` whose name starts with ``prefix`` (0 when gone)."""
    total = 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if not f.read().startswith(prefix):
                        continue
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def cost_cell(n: int, sync: bool, st: Settings) -> dict[str, Any]:
    async with SimFleet(4, "--time-scale", "0.02", "--model", MODEL) as fleet:
        epps = replicas(n, fleet.hostports, sync=sync, config=CONFIG)
        await start_all(epps)
        try:
            vs = [xc.variants(prompts(256, i), MODEL) for i in range(n)]
            await asyncio.sleep(1.0)  # let start-up work (first scrapes, warm start) settle
            idle0 = cpu_seconds(epps[0].pid)
            t_idle = time.perf_counter()
            await asyncio.sleep(2.0)  # the idle window: scrape loops, heartbeats
            idle_rate = (cpu_seconds(epps[0].pid) - idle0) / (time.perf_counter() - t_idle)
            c0 = cpu_seconds(epps[0].pid)
            z0 = thread_cpu(epps[0].pid, "ZMQbg/IO")
            t0 = time.perf_counter()
            stats = await asyncio.gather(
                *(
                    xc.open_loop("127.0.0.1", e.grpc_port, vs[i], rate=st.cost_rate, seconds=st.cost_seconds)
                    for i, e in enumerate(epps)
                )
            )
            wall = time.perf_counter() - t0
            busy = cpu_seconds(epps[0].pid) - c0 - idle_rate * wall
            zmq_io = thread_cpu(epps[0].pid, "ZMQbg/IO") - z0
            text = await metrics_text(epps[0].metrics_port)
        finally:
            await stop_all(epps)
    s0 = stats[0]
    lag = histogram_quantile(text, "epp_sync_delta_lag_seconds", 0.99)
    return {
        "replicas": n,
        "sync": sync,
        "routed": s0.routed,
        "failed": sum(s.failed for s in stats),
        "refused": sum(s.refused for s in stats),
        "cpu_us_per_request": rnd(busy / s0.routed * 1e6, 1) if s0.routed else None,
        # of which libzmq's I/O thread (TCP reads and writes of the sync sockets; invisible to py-spy)
        "zmq_io_us_per_request": rnd(zmq_io / s0.routed * 1e6, 1) if s0.routed else None,
        "idle_cores": rnd(idle_rate),
        "p99_ms": rnd((xc.percentile(s0.latencies, 0.99) or 0) * 1e3),
        "batches_sent": sample_sum(text, "epp_sync_batches_sent_total"),
        "batches_received": sample_sum(text, "epp_sync_batches_received_total"),
        "staleness_p99_ms": rnd(lag * 1e3) if lag is not None else None,
    }


def _median(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c[key] for c in cells if c[key] is not None]
    return rnd(statistics.median(values), 1) if values else None


async def cost(st: Settings) -> dict[str, Any]:
    """Every cell ``COST_ROUNDS`` times, the rounds interleaved (a burst of load from elsewhere
    on the machine hits one round of every cell, not every round of one cell); medians."""
    order = [(1, False)] + [(n, sync) for n in st.cost_ns for sync in (False, True) if n > 1 or sync]
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {key: [] for key in order}
    for r in range(COST_ROUNDS):
        for n, sync in order:
            try:
                one = await cost_cell(n, sync, st)
            except RuntimeError as e:  # a port taken meanwhile by another process: once more
                log(f"scaleout cost: {n} replicas, sync {sync}: {str(e)[:200]}; again")
                one = await cost_cell(n, sync, st)
            runs[(n, sync)].append(one)
            log(f"scaleout cost (round {r + 1}/{COST_ROUNDS}): {runs[(n, sync)][-1]}")
    cells = []
    for (n, sync), rounds in runs.items():
        cell: dict[str, Any] = {"replicas": n, "sync": sync, "rounds": rounds}
        for key in ("cpu_us_per_request", "zmq_io_us_per_request", "staleness_p99_ms", "batches_received"):
            cell[key] = _median(rounds, key)
        cells.append(cell)
    by = {(c["replicas"], c["sync"]): c for c in cells}
    c1 = by[(1, False)]["cpu_us_per_request"]
    scaling: dict[str, float | None] = {}
    overhead: dict[str, float | None] = {}
    crowding: dict[str, float | None] = {}
    for c in cells:
        n, mine = c["replicas"], c["cpu_us_per_request"]
        if c["sync"] and mine and c1:
            scaling[str(n)] = rnd(n * c1 / mine, 2)
            off = by.get((n, False), by[(1, False)])["cpu_us_per_request"]
            overhead[str(n)] = rnd(mine / off, 2) if off else None
        elif not c["sync"] and mine and c1:
            crowding[str(n)] = rnd(mine / c1, 2)
    lags = [c["staleness_p99_ms"] for c in cells if c["sync"] and c["staleness_p99_ms"] is not None]
    worst = max(lags) if lags else None
    return {
        "cells": cells,
        "effective_scaling": scaling,
        # not the goal, what explains it: sync on / sync off at the same N (the sync's own cost),
        # and sync off at N / alone (N processes and their load crowding 2 cores)
        "sync_on_vs_off_same_n": overhead,
        "sync_off_vs_alone": crowding,
        "staleness_p99_ms_worst": worst,
        "met": {
            "scaling_4": (scaling.get("4") or 0) >= GOALS["scaling_4"],
            "scaling_8": (scaling.get("8") or 0) >= GOALS["scaling_8"],
            "staleness": worst is not None and worst <= GOALS["staleness_p99_ms"],
        },
    }


# ---------------------------------------------------------------------------------------------
# part: workers


async def workers_cell(workers: int, st: Settings) -> dict[str, Any]:
    async with SimFleet(4, "--time-scale", "0.02", "--model", MODEL) as fleet:
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            f"--config-file={CONFIG}",
            f"--workers={workers}",
        )
        await epp.start()
        try:
            vs = xc.variants(prompts(256, 0), MODEL)
            await xc.closed_loop("127.0.0.1", epp.grpc_port, vs, connections=8, concurrency=64, seconds=1.0)
            stats = await xc.closed_loop(
                "127.0.0.1", epp.grpc_port, vs, connections=8, concurrency=64, seconds=st.workers_seconds
            )
        finally:
            await epp.stop()
    return {
        "workers": workers,
        "rps": rnd(stats.routed / st.workers_seconds, 1),
        "p99_ms": rnd((xc.percentile(stats.latencies, 0.99) or 0) * 1e3),
        "failed": stats.failed,
    }


async def workers(st: Settings) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for _ in range(st.workers_rounds):
        one = await workers_cell(1, st)
        two = await workers_cell(2, st)
        rounds.append({"one": one, "two": two, "ratio": rnd(two["rps"] / one["rps"]) if one["rps"] else None})
        log(f"scaleout workers: {rounds[-1]}")
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    ratio = rnd(statistics.median(ratios)) if ratios else None
    p99_ok = all(r["two"]["p99_ms"] <= r["one"]["p99_ms"] for r in rounds)
    return {
        "rounds": rounds,
        "capacity_ratio_median": ratio,
        "met": {"capacity": ratio is not None and ratio >= GOALS["workers_2"], "p99_no_worse": p99_ok},
    }


# ---------------------------------------------------------------------------------------------
# part: faults


class Pacer:
    """Small completions through Envoy at a steady rate; failures recorded with their time."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = url
        self.rate = rate
        self.sent = 0
        self.failures: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            start = time.perf_counter()
            i = 0
            while not self._stop.is_set():
                due = start + i / self.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                    if self._stop.is_set():
                        break
                t = asyncio.create_task(self._one(http, i))
                pending.add(t)
                t.add_done_callback(pending.discard)
                i += 1
            if pending:
                await asyncio.gather(*pending)

    async def _one(self, http: aiohttp.ClientSession, i: int) -> None:
        self.sent += 1
        body = {"model": MODEL, "prompt": f"system prompt {i % 8} " * 40 + f"q{i}", "max_tokens": 2}
        try:
            async with http.post(self.url + "/v1/completions", json=body) as r:
                await r.read()
                ok = r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        if not ok:
            self.failures.append(time.perf_counter())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def hit_ratio(text: str) -> tuple[float, float]:
    """(sum, count) of the EPP's per-request predicted prefix hit ratio histogram."""
    fam = "inference_extension_prefix_indexer_hit_ratio"
    return sample_sum(text, fam + "_sum"), sample_sum(text, fam + "_count")


async def faults(st: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with SimFleet(4, "--time-scale", "0.02", "--model", MODEL) as fleet:
        slots = 6  # three serving, three for the rolling update's new pods
        pool = Ports()
        ports = [pool.one(pair=True) for _ in range(slots)]
        epps: list[EppProcess] = []
        for i in range(slots):
            args = [
                f"--endpoints={','.join(fleet.hostports)}",
                "--bind-address=127.0.0.1",
                f"--config-file={CONFIG}",
            ]
            args += peer_args(i, ports)
            epps.append(epp(pool, *args))
        await start_all(epps[:3])
        cfg = EnvoyConfig(
            ext_proc_port=epps[0].grpc_port,
            ext_proc_replicas=[(e.grpc_port, e.health_port) for e in epps],
            ext_proc_health_service="readiness",
            ext_proc_panic_threshold=0.0,  # as deploy/envoy/active-active.yaml
        )
        try:
            async with Envoy(cfg) as envoy:
                pacer = Pacer(envoy.url, st.faults_rate)
                pacer.start()
                await asyncio.sleep(3.0)  # steady state, indexes warm
                killed_at = time.perf_counter()
                assert epps[1].proc is not None
                epps[1].proc.send_signal(signal.SIGKILL)
                await epps[1].proc.wait()
                await asyncio.sleep(3.0)
                late = [t for t in pacer.failures if t > killed_at + 1.0]
                out["kill"] = {
                    "failed_total": len(pacer.failures),
                    "failed_after_1s": len(late),
                    "last_failure_after_kill_s": rnd(max(pacer.failures) - killed_at)
                    if pacer.failures
                    else None,
                }
                # restart: warm start from a peer, then its first 100 requests against its peers'
                before = [hit_ratio(await metrics_text(e.metrics_port)) for e in (epps[0], epps[2])]
                await epps[1].start()
                await poll(lambda: _served(epps[1]), 60.0, "the restarted replica served 100 requests")
                after = [hit_ratio(await metrics_text(e.metrics_port)) for e in (epps[0], epps[2])]
                mine = hit_ratio(await metrics_text(epps[1].metrics_port))
                peers_sum = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                peers_cnt = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                peer_ratio = peers_sum / peers_cnt if peers_cnt else None
                my_ratio = mine[0] / mine[1] if mine[1] else None
                out["restart"] = {
                    "restarted_hit_ratio": None if my_ratio is None else rnd(my_ratio),
                    "peers_hit_ratio": None if peer_ratio is None else rnd(peer_ratio),
                    "vs_peers": rnd(my_ratio / peer_ratio) if my_ratio is not None and peer_ratio else None,
                }
                # rolling update: 3..5 replace 0..2
                failed_before = len(pacer.failures)
                for new, old in ((3, 0), (4, 1), (5, 2)):
                    await epps[new].start()
                    await epps[old].stop()
                await asyncio.sleep(2.0)
                await pacer.stop()
                out["rolling"] = {"sent": pacer.sent, "failed": len(pacer.failures) - failed_before}
        finally:
            await stop_all(epps)
    vs = out["restart"]["vs_peers"]
    out["met"] = {
        "kill": out["kill"]["failed_after_1s"] <= GOALS["faults_failed_after_drop"],
        "warm_start": vs is not None and vs >= GOALS["warm_hit_ratio_vs_peers"],
        "rolling": out["rolling"]["failed"] <= GOALS["rolling_failed"],
    }
    return out


async def poll(cond: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Await ``cond`` every 50 ms until it holds; RuntimeError naming ``what`` after ``timeout``."""
    deadline = time.perf_counter() + timeout
    while not await cond():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)


async def _served(epp: EppProcess) -> bool:
    _, count = hit_ratio(await metrics_text(epp.metrics_port))
    return count >= 100


# ---------------------------------------------------------------------------------------------


PARTS = {"quality": quality, "cost": cost, "workers": workers, "faults": faults}


async def run(parts: Sequence[str], st: Settings) -> dict[str, Any]:
    doc: dict[str, Any] = {"goals": GOALS}
    for p in parts:
        log(f"scaleout: part {p}")
        try:
            doc[p] = await PARTS[p](st)
        except Exception as e:  # one failing part is recorded, the others still run
            log(f"scaleout: part {p} failed: {e!r}")
            doc[p] = {"error": repr(e)}
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", default=",".join(PARTS))
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts: {', '.join(sorted(unknown))}")
    st = QUICK if args.quick else FULL
    doc = uvloop.run(run(parts, st))
    path = write_result("scaleout", doc, mode="quick" if args.quick else "full", seeds=SEEDS)
    log(f"scaleout: wrote {path}")
    for p in parts:
        log(f"scaleout {p}: met={doc[p].get('met')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
