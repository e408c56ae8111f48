"""Live config reload under load: how soon a new weight takes effect, and what the swap costs.

Run ``python -m bench.reload [--quick]``; prints a table and writes bench/results/reload.json.

Three simulator replicas behind Envoy and the EPP; requests arrive open-loop (Poisson) at
300/s, all with one long prompt.  The config starts with ``prefix-cache-scorer`` at weight
100, which pins every request to the replica the first one went to.  Mid-run the config file
is rewritten the way an editor or kubelet does it (a new file renamed over the old one) with
the prefix weight at 0: the queue scorer then spreads the requests over the fleet.  Measured
per round:

* **time to new behaviour**: from the rename to the first request answered by another
  replica (upper bound: its completion; lower bound: its send), against the 2 s goal;
* **failures**: non-2xx or transport errors over the whole run (goal 0);
* **latency around the swap**: a first rewrite changes the queue scorer's weight (1 -> 2), which
  builds and swaps in a new pipeline but leaves routing pinned, so the latency of requests
  sent in the second after it (in flight while the file was read, the config built in a
  thread and the pipeline swapped) compares like for like with the steady state before it,
  same run; goal: p99 and max delayed by at most 10 ms.  (Around the routing change itself
  latency drops: the load leaves the one busy replica.)

The EPP's own log line (``config_reloaded``) gives the build-and-swap time on its side.

Then, in this process, **event-loop stalls**: an ``App`` built as ``epp`` builds it, a task
that only yields (``await asyncio.sleep(0)``) records the gaps between its turns, first with
nothing else running, then while the same two configs are reloaded back to back (each a full
parse, validation and build in the worker thread, and a swap); and once more with Python's
default 5 ms GIL switch interval during the build, to show what the 0.5 ms one buys.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import log, rnd, versions, write_result
from bench.httpload import Pool, percentile, post
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

SEED = 7
RATE = 300.0
SIM = ("--time-scale", "0.02", "--seed", "7", "--max-model-len", "131072")
PROMPT = "Summarise the plot of a long novel about a lighthouse keeper. " * 8
GOALS = {"time_to_effect_s": 2.0, "failures": 0, "swap_delay_ms": 10.0}
HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def config(prefix_weight: float, queue_weight: float = 1) -> str:
    return (
        HEAD
        + f"""plugins:
- type: queue-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: {prefix_weight}
  - pluginRef: queue-scorer
    weight: {queue_weight}
"""
    )


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float  # of load per round
    neutral_at: float  # seconds into the round of the rewrite that changes a weight, not routing
    change_at: float  # seconds into the round of the rewrite that changes routing
    rounds: int
    lag_seconds: float  # per in-process event-loop stall measurement


QUICK = Settings(seconds=8.0, neutral_at=3.0, change_at=5.0, rounds=1, lag_seconds=1.0)
FULL = Settings(seconds=16.0, neutral_at=6.0, change_at=10.0, rounds=3, lag_seconds=3.0)
NEUTRAL_WINDOW = 1.0  # seconds after the neutral rewrite: detection (<= 2 polls), build and swap


@dataclass(slots=True)
class Shot:
    sent: float
    done: float
    ok: bool
    served_by: str


def rewrite(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _one(pool: Pool, data: bytes, scheduled: float, out: list[Shot]) -> None:
    try:
        r = await pool.send(data, 10.0)
        out.append(Shot(scheduled, r.done, 200 <= r.status < 300, r.served_by))
    except (OSError, TimeoutError, ConnectionError, ValueError):
        out.append(Shot(scheduled, time.perf_counter(), False, ""))


async def _load(pool: Pool, data: bytes, seconds: float, seed: int, out: list[Shot]) -> None:
    """Open-loop Poisson arrivals at RATE; latency counts from the scheduled time."""
    rng = random.Random(seed)
    start = time.perf_counter()
    at, tasks = 0.0, []
    while (at := at + rng.expovariate(RATE)) < seconds:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(pool, data, start + at, out)))
    await asyncio.gather(*tasks)


def _epp_reload_line(epp: EppProcess) -> dict[str, Any]:
    for line in reversed(epp.log_tail(200_000).splitlines()):
        if '"config_reloaded"' in line:
            try:
                return dict(json.loads(line[line.index("{") :]))
            except ValueError:
                return {}
    return {}


def _lat(shots: list[Shot]) -> dict[str, float | None]:
    ms = [(s.done - s.sent) * 1000 for s in shots if s.ok]
    return {
        "n": len(ms),
        "p50_ms": rnd(percentile(ms, 50)),
        "p99_ms": rnd(percentile(ms, 99)),
        "max_ms": rnd(max(ms)) if ms else None,
    }


async def round_(settings: Settings, seed: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    cfg = tmp / "config.yaml"
    cfg.write_text(config(100))
    data = post("/v1/completions", orjson.dumps({"model": "mock-model", "prompt": PROMPT, "max_tokens": 2}))
    async with SimFleet(3, *SIM) as fleet:
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1", f"--config-file={cfg}"
        )
        async with epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy:
            pool = Pool("127.0.0.1", envoy.port)
            warm = await pool.send(data)  # the prefix index now pins the prompt to this replica
            pinned = warm.served_by
            shots: list[Shot] = []
            neutral = written = 0.0

            async def change() -> None:
                nonlocal neutral, written
                t0 = time.perf_counter()
                await asyncio.sleep(settings.neutral_at)
                rewrite(cfg, config(100, queue_weight=2))  # a new pipeline; routing stays pinned
                neutral = time.perf_counter()
                await asyncio.sleep(max(0.0, t0 + settings.change_at - time.perf_counter()))
                rewrite(cfg, config(0, queue_weight=2))
                written = time.perf_counter()

            await asyncio.gather(_load(pool, data, settings.seconds, seed, shots), change())
            pool.close()
            epp_line = _epp_reload_line(epp)
    shots.sort(key=lambda s: s.sent)
    before = [s for s in shots if s.sent < written]
    after = [s for s in shots if s.sent >= written and s.ok and s.served_by != pinned]
    first_other = min(after, key=lambda s: s.done) if after else None
    effect_done = (first_other.done - written) if first_other else None
    effect_sent = (first_other.sent - written) if first_other else None
    start = shots[0].sent if shots else 0.0
    steady = [s for s in before if start + 1.0 < s.sent < neutral]
    # in flight while the neutral config was detected, built and swapped in: same routing
    swap = [s for s in shots if neutral <= s.sent <= neutral + NEUTRAL_WINDOW]
    change_end = written + (effect_done or 0.0) + 0.25
    change_window = [s for s in shots if written <= s.sent <= change_end]
    tail = [s for s in shots if s.sent > change_end]
    steady_lat, swap_lat = _lat(steady), _lat(swap)
    spread = Counter(s.served_by for s in tail if s.ok)
    return {
        "pinned_share_before": rnd(sum(s.served_by == pinned for s in before) / max(1, len(before))),
        "replicas_after": len(spread),
        "pinned_share_after": rnd(spread[pinned] / max(1, sum(spread.values()))),
        "time_to_effect_s": None if effect_done is None else rnd(effect_done),
        "time_to_effect_lower_s": None if effect_sent is None else rnd(effect_sent),
        "requests": len(shots),
        "failures": sum(not s.ok for s in shots),
        "achieved_rps": rnd(len(shots) / settings.seconds, 1),
        "steady": steady_lat,
        "swap_window": swap_lat,
        "change_window": _lat(change_window),
        "pinned_share_in_swap_window": rnd(sum(s.served_by == pinned for s in swap) / max(1, len(swap))),
        "swap_delay_p99_ms": _delta(swap_lat["p99_ms"], steady_lat["p99_ms"]),
        "swap_delay_max_ms": _delta(swap_lat["max_ms"], steady_lat["max_ms"]),
        "epp_reload_seconds": epp_line.get("seconds"),  # the routing change's build + swap
        "epp_swap_on_loop_ms": None
        if epp_line.get("swap_seconds") is None
        else rnd(epp_line["swap_seconds"] * 1000),
        "epp_generation": epp_line.get("generation"),  # 3: startup, neutral, routing change
    }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else rnd(a - b)


def _worst(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return max(values) if values else None


async def _gaps(seconds: float, work: Any = None) -> list[float]:
    """Gaps (ms) between turns of a task that only yields, for ``seconds``, while ``work`` runs."""
    gaps: list[float] = []
    loop_end = time.perf_counter() + seconds
    task = asyncio.create_task(work(loop_end)) if work is not None else None
    last = time.perf_counter()
    while (now := time.perf_counter()) < loop_end:
        gaps.append((now - last) * 1000)
        last = now
        await asyncio.sleep(0)
    if task is not None:
        await task
    return gaps


def _gap_stats(gaps: list[float]) -> dict[str, float | None]:
    return {
        "turns": len(gaps),
        "p99_ms": rnd(percentile(gaps, 99)),
        "p999_ms": rnd(percentile(gaps, 99.9)),
        "max_ms": rnd(max(gaps)) if gaps else None,
    }


async def _reload_until(reloader: Any, end: float, swaps: list[float], totals: list[float]) -> None:
    """Reload two configs in turn (a new pipeline each time) until ``end``."""
    while time.perf_counter() < end:
        text = config(100, queue_weight=2 + len(totals) % 2)
        started = time.perf_counter()
        await reloader.reload(text.encode())
        totals.append((time.perf_counter() - started) * 1000)
        swaps.append(reloader.last_swap_seconds * 1000)


async def loop_lag(seconds: float) -> dict[str, Any]:
    """Event-loop stalls in-process while configs are reloaded back to back (see the module doc)."""
    from epp.app.compose import build_app
    from epp.app.serve import tune_gc
    from epp.cli.flags import parse_flags
    from epp.log import configure_logging

    tmp = Path(tempfile.mkdtemp(prefix="bench-reload-lag-"))
    cfg = tmp / "config.yaml"
    cfg.write_text(config(100))
    argv = [f"--config-file={cfg}", "--endpoints=127.0.0.1:1,127.0.0.1:2", "--config-reload-interval=0"]
    options = parse_flags(argv, {})
    configure_logging(options, stream=io.StringIO())  # logged as epp logs (JSON, info), not shown
    app = build_app(options, {})
    tune_gc()  # as epp does once started: the startup heap frozen, fewer young collections
    return await _loop_lag(app, seconds)


async def _loop_lag(app: Any, seconds: float) -> dict[str, Any]:
    import epp.app.reload as reload_module
    from epp.app.reload import ConfigReloader

    out: dict[str, Any] = {"idle": _gap_stats(await _gaps(seconds))}
    fine = reload_module.BUILD_SWITCH_INTERVAL
    async with ConfigReloader(app) as reloader:
        for label, interval in (("reloading", fine), ("reloading_5ms_gil", 0.005)):
            reload_module.BUILD_SWITCH_INTERVAL = interval  # type: ignore[misc]
            swaps: list[float] = []
            totals: list[float] = []
            stats = _gap_stats(
                await _gaps(seconds, lambda end, s=swaps, t=totals: _reload_until(reloader, end, s, t))
            )
            stats["reloads"] = len(totals)
            stats["reload_p50_ms"] = rnd(percentile(totals, 50))
            stats["swap_on_loop_max_ms"] = rnd(max(swaps)) if swaps else None
            out[label] = stats
        reload_module.BUILD_SWITCH_INTERVAL = fine  # type: ignore[misc]
    return out


async def run(settings: Settings) -> dict[str, Any]:
    rounds = []
    for i in range(settings.rounds):
        r = await round_(settings, SEED + i)
        log(
            f"round {i + 1}: effect {r['time_to_effect_s']} s (>= {r['time_to_effect_lower_s']}), "
            f"failures {r['failures']}/{r['requests']}, steady p99 {r['steady']['p99_ms']} ms "
            f"max {r['steady']['max_ms']} | swap p99 {r['swap_window']['p99_ms']} "
            f"max {r['swap_window']['max_ms']} ms (n={r['swap_window']['n']}), "
            f"replicas after {r['replicas_after']}, EPP build+swap {r['epp_reload_seconds']} s "
            f"(on the loop {r['epp_swap_on_loop_ms']} ms)"
        )
        rounds.append(r)
    summary = {
        "time_to_effect_s": _worst(rounds, "time_to_effect_s"),
        "failures": sum(r["failures"] for r in rounds),
        "swap_delay_p99_ms": _worst(rounds, "swap_delay_p99_ms"),
        "swap_delay_max_ms": _worst(rounds, "swap_delay_max_ms"),
        "routing_changed": all(r["pinned_share_before"] == 1.0 and r["replicas_after"] > 1 for r in rounds),
    }
    summary["meets_goals"] = bool(
        summary["time_to_effect_s"] is not None
        and summary["time_to_effect_s"] <= GOALS["time_to_effect_s"]
        and summary["failures"] == GOALS["failures"]
        and (summary["swap_delay_p99_ms"] or 0.0) <= GOALS["swap_delay_ms"]
        and summary["routing_changed"]
    )
    lag = await loop_lag(settings.lag_seconds)
    for label in ("idle", "reloading", "reloading_5ms_gil"):
        log(f"event loop {label}: {lag[label]}")
    summary["loop_stall_p999_ms"] = lag["reloading"]["p999_ms"]
    summary["loop_stall_idle_p999_ms"] = lag["idle"]["p999_ms"]
    return {
        "rate": RATE,
        "goals": GOALS,
        "summary": summary,
        "rounds": rounds,
        "loop_lag": lag,
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reload", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    settings = QUICK if args.quick else FULL
    log(f"reload: {settings.rounds} round(s) of {settings.seconds:g} s at {RATE:g} req/s ({mode})")
    result = asyncio.run(run(settings))
    path = write_result("reload", result, mode=mode, seeds={"loadgen": SEED})
    s = result["summary"]
    log(
        f"reload: time to new behaviour {s['time_to_effect_s']} s (goal <= 2), failures {s['failures']} "
        f"(goal 0), swap delay p99 {s['swap_delay_p99_ms']} ms / max {s['swap_delay_max_ms']} ms "
        f"(goal <= 10), routing changed {s['routing_changed']} -> {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
