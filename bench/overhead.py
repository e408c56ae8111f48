"""Comparison 2, overhead: what each routing hop adds to a near-instant upstream, and what it costs.

    python -m bench.overhead [--quick]      # writes bench/results/overhead.json

Paths: (a) direct, (b) Envoy alone (round robin), (c) Envoy + the no-op Python ext_proc server
(bench/noop_extproc.py: the floor of the protocol in Python) on grpc.aio, (c') the same no-op
server on the EPP's own transport (src/epp/server/h2: the floor under the EPP), (d) Envoy + the EPP
with the default and the prefix-heavy config, under GIE's Envoy config (FULL_DUPLEX_STREAMED) and
under deploy/envoy/lean.yaml (only the phases the plugins need), each with its fair floor: the
no-op server under the same Envoy config asking for the same phases (c''), (e) vllm-router and
sglang-router (cache_aware) when installed.  1 KB chat requests, non-streamed answers from 4
upstreams.  Open-loop Poisson windows over a rate ladder, paths interleaved within each round and
their order rotated between rounds (at the hop rate in HOP_SLICES slices each, taken in turn);
latency from the scheduled send time.  A path that cannot keep up with a rate (achieved < 90% of
offered, or errors) is not offered the higher rates.  Capacity: closed loop with 32 concurrent
requests, in HOP_SLICES slices taken in turn.  CPU: utime+stime of the routing processes
only, per successful request, split by process (Envoy, the ext_proc server); the hop goals
(issue 31) are medians over rounds of ratios (and of p50 differences) within a round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from bench.common import log, sum_cpu, versions, write_result
from bench.httpload import RunResult, closed_loop, open_loop, percentile, post, summarize
from bench.paths import (
    DIRECT,
    ENVOY,
    EPP,
    EPP_FAIL_OPEN,
    EPP_LEAN,
    EPP_PREFIX,
    EPP_PREFIX_LEAN,
    FLOOR,
    FLOOR_H2,
    FLOOR_H2_LEAN,
    FLOOR_H2_LEAN_FULL,
    PEERS,
    Lab,
    Path,
    available,
)
from bench.profiling import Profiler

SEED = 7
GOALS = {
    "epp_added_p50_ms_over_floor": 0.3,
    "epp_added_p50_ms_over_own_floor": 0.3,
    "epp_req_per_s_per_core": 1000.0,
}
# A rate is "sustained" when nearly all offered requests succeed and the tail stays short.
SUSTAIN_FRACTION = 0.95
SUSTAIN_P99_MS = 20.0
PROFILE_RATE = 600  # req/s while py-spy samples the EPP: busy, below saturation
# The whole hop against its fair floor (issue 31): Envoy + EPP CPU per request at capacity, capacity,
# and added p50 at HOP_RATE, each an EPP path over the no-op path under the same Envoy config.
HOP_GOALS = {"cpu_ratio": 1.25, "capacity_ratio": 0.85, "added_p50_ms": 0.15}
HOP_RATE = 200
# Slices of a path's window at HOP_RATE and of its capacity window, interleaved with the other
# paths' (see ``run``).
HOP_SLICES = 4
# (GIE's Envoy config, lean Envoy config) pairs of the same EPP config: what the lean config saves Envoy.
LEAN_PAIRS = {"default": ("epp", "epp-lean"), "prefix-heavy": ("epp-prefix", "epp-prefix-lean")}
SPECS = (
    DIRECT,
    ENVOY,
    FLOOR,
    FLOOR_H2,
    FLOOR_H2_LEAN,
    FLOOR_H2_LEAN_FULL,
    EPP,
    EPP_PREFIX,
    EPP_LEAN,
    EPP_PREFIX_LEAN,
    EPP_FAIL_OPEN,
    *PEERS,
)


@dataclass(frozen=True, slots=True)
class Settings:
    rates: tuple[int, ...]
    window_s: float
    rounds: int
    capacity_s: float
    concurrency: int
    profile_s: float


QUICK = Settings(rates=(200, 600), window_s=2.0, rounds=1, capacity_s=2.0, concurrency=32, profile_s=3.0)
FULL = Settings(
    rates=(100, 200, 300, 600, 1000, 1500, 2000, 3000),
    window_s=5.0,
    rounds=3,
    capacity_s=5.0,
    concurrency=32,
    profile_s=10.0,
)


def chat_requests(n: int, size: int, seed: int, *, stream: bool = False, max_tokens: int = 16) -> list[bytes]:
    """``n`` distinct OpenAI chat requests whose JSON body is about ``size`` bytes."""
    rng = random.Random(seed)
    words = ("the", "model", "cache", "prefix", "token", "route", "server", "gateway", "queue", "batch")
    out = []
    for i in range(n):
        parts: list[str] = [f"user {i}:"]
        length = 0
        while length < size - 160:
            w = rng.choice(words)
            parts.append(w)
            length += len(w) + 1
        body = {
            "model": "mock-model",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": " ".join(parts)},
            ],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        out.append(post("/v1/chat/completions", orjson.dumps(body)))
    return out


def _cpu_per_req(seconds: dict[str, float], ok: int) -> dict[str, float | None]:
    out: dict[str, float | None] = {k: (round(v / ok * 1e6, 1) if ok else None) for k, v in seconds.items()}
    out["total"] = round(sum(seconds.values()) / ok * 1e6, 1) if ok else None
    return out


async def measure(
    path: Path, requests: list[bytes], *, rate: float, window: float, seed: int
) -> dict[str, Any]:
    meter = path.meter()
    meter.start()
    run = await open_loop(path.client(), requests, rate=rate, duration=window, seed=seed)
    cpu = meter.stop()
    return _record(run, cpu)


def _record(run: RunResult, cpu: dict[str, float]) -> dict[str, Any]:
    s: dict[str, Any] = summarize(run)
    s["cpu_s"] = {k: round(v, 3) for k, v in cpu.items()}
    s["cpu_us_per_req"] = _cpu_per_req(cpu, s["ok"])
    s["_lat_ms"] = [x.latency * 1000 for x in run.ok]
    return s


def _pool(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the windows of one (path, rate) cell across rounds."""
    lat = sorted(x for w in windows for x in w["_lat_ms"])
    ok = sum(w["ok"] for w in windows)
    offered = sum(w["offered"] for w in windows)
    cpu = sum_cpu(windows)
    wall = sum(w["wall_s"] for w in windows)
    by_round = _rounds_of(windows)
    return {
        "rounds": len(by_round),
        "offered": offered,
        "ok": ok,
        "errors": sum(w["errors"] for w in windows),
        "achieved_rps": round(ok / wall, 1) if wall else 0.0,
        "p50_ms": round(percentile(lat, 50), 3) if lat else None,
        "p90_ms": round(percentile(lat, 90), 3) if lat else None,
        "p99_ms": round(percentile(lat, 99), 3) if lat else None,
        "client_late_p99_ms": max((w["client_late_p99_ms"] or 0.0) for w in windows),
        "cpu_us_per_req": _cpu_per_req(cpu, ok),
        "sustained": all(_sustained(ws) for ws in by_round.values()),
    }


def _rounds_of(windows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The windows by round (its slices at the hop rate); a window without one is a round of its own."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for i, w in enumerate(windows):
        by_round.setdefault(w.get("round", i), []).append(w)
    return by_round


def _sustained(windows: list[dict[str, Any]]) -> bool:
    """The sustain rule over one round's windows of a cell (its slices at the hop rate, pooled)."""
    offered = sum(w["offered"] for w in windows)
    ok = sum(w["ok"] for w in windows)
    lat = [x for w in windows for x in w["_lat_ms"]]
    return bool(
        offered
        and ok >= SUSTAIN_FRACTION * offered
        and not any(w["errors"] for w in windows)
        and lat
        and percentile(lat, 99) <= SUSTAIN_P99_MS
    )


async def run(mode: str, *, profile: bool = True, rounds: int | None = None) -> dict[str, Any]:
    st = QUICK if mode == "quick" else FULL
    if rounds:
        st = replace(st, rounds=rounds)
    specs, notes = available(SPECS)
    for n in notes:
        log(f"overhead: {n}")
    requests = chat_requests(64, 1024, SEED)
    cells: dict[str, dict[int, list[dict[str, Any]]]] = {s.name: {} for s in specs}
    capacity: dict[str, list[dict[str, Any]]] = {s.name: [] for s in specs}
    gave_up: dict[str, int] = {}
    prof: dict[str, Any] = {}
    async with Lab(specs) as lab:
        idle = lab.idle_report()
        paths = list(lab.paths.values())
        log("overhead: warming up every path")
        for p in paths:
            await closed_loop(p.client(), requests, concurrency=8, duration=0.5)
        for rnd in range(st.rounds):
            order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
            for rate in st.rates:
                # At the hop rate each path's window is cut into slices taken in turn with every
                # other path's, so the paths share the machine's drift within the round.
                slices = HOP_SLICES if rate == HOP_RATE else 1
                for k in range(slices):
                    for p in order:
                        if gave_up.get(p.name, 10**9) < rate:
                            continue
                        w = await measure(
                            p,
                            requests,
                            rate=rate,
                            window=st.window_s / slices,
                            seed=SEED + rnd * 1000 + rate + k * 100_000,
                        )
                        w["round"] = rnd
                        cells[p.name].setdefault(rate, []).append(w)
                        log(
                            f"overhead: round {rnd + 1}/{st.rounds} {rate:>5} req/s {p.name:<14} "
                            f"{'' if slices == 1 else f'slice {k + 1}/{slices} '}"
                            f"p50 {w['p50_ms']} ms p99 {w['p99_ms']} ms ok {w['ok']}/{w['offered']} "
                            f"cpu {w['cpu_us_per_req']['total']} us/req"
                        )
                        if w["ok"] < 0.9 * w["offered"] or w["errors"]:
                            gave_up[p.name] = min(gave_up.get(p.name, 10**9), rate)
            # Capacity in slices taken in turn too: each round's ratios compare paths measured
            # within seconds of each other, not a whole round apart.
            slices_of: dict[str, list[dict[str, Any]]] = {p.name: [] for p in order}
            for _ in range(HOP_SLICES):
                for p in order:
                    meter = p.meter()
                    meter.start()
                    cl = await closed_loop(
                        p.client(), requests, concurrency=st.concurrency, duration=st.capacity_s / HOP_SLICES
                    )
                    slices_of[p.name].append(_record(cl, meter.stop()))
            for p in order:
                c = capacity_cell(slices_of[p.name])
                capacity[p.name].append(c)
                log(
                    f"overhead: round {rnd + 1}/{st.rounds} capacity {p.name:<14} {c['achieved_rps']} req/s, "
                    f"cpu {c['cpu_us_per_req']['total']} us/req"
                )
        if profile and "epp" in lab.paths:
            p = lab.paths["epp"]
            log(
                f"overhead: profiling the EPP (py-spy, {st.profile_s:.0f} s, "
                f"open loop at {min(st.rates[-1], PROFILE_RATE)} req/s)"
            )
            rate = min(st.rates[-1], PROFILE_RATE)
            for native in (False, True):  # Python frames, then native frames (pauses the EPP per sample)
                async with Profiler(p.pids["extproc"], st.profile_s, native=native) as pr:
                    await open_loop(p.client(), requests, rate=rate, duration=st.profile_s, seed=SEED)
                prof["native" if native else "python"] = pr.summary()
    ladder: dict[str, dict[str, Any]] = {}
    for name, by_rate in cells.items():
        ladder[name] = {str(rate): _pool(ws) for rate, ws in sorted(by_rate.items())}
    result: dict[str, Any] = {
        "idle_cores": idle,
        "settings": {
            **asdict(st),
            "request_bytes": len(requests[0]),
            "upstreams": 4,
            "sustain_rule": f">= {SUSTAIN_FRACTION:.0%} of offered ok, no errors, p99 <= {SUSTAIN_P99_MS} ms",
        },
        "paths": {s.name: s.title for s in specs},
        "notes": notes,
        "ladder": ladder,
        "capacity": {name: _best(cs) for name, cs in capacity.items()},
        "hop_p50_rounds": {
            name: p50_by_round(by_rate.get(HOP_RATE, []), st.rounds) for name, by_rate in cells.items()
        },
        "capacity_rounds": {
            name: [{"achieved_rps": c["achieved_rps"], "cpu_us_per_req": c["cpu_us_per_req"]} for c in cs]
            for name, cs in capacity.items()
        },
        "floors": {s.name: s.floor for s in specs if s.floor},
        "max_sustained_rps": {
            name: max((int(r) for r, c in cells_.items() if c["sustained"]), default=0)
            for name, cells_ in ladder.items()
        },
        "profile": prof,
    }
    result["derived"] = derive(result)
    return result


def p50_by_round(windows: list[dict[str, Any]], rounds: int) -> list[float | None]:
    """Each round's p50 (ms) over its slices at the hop rate; None for a round without one."""
    by_round = _rounds_of(windows)
    out: list[float | None] = []
    for rnd in range(rounds):
        lat = [x for w in by_round.get(rnd, ()) for x in w["_lat_ms"]]
        out.append(round(percentile(lat, 50), 3) if lat else None)
    return out


def capacity_cell(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's capacity in one round from its slices: requests over their summed wall time,
    CPU over their summed requests (``_pool``), without the latencies."""
    return {k: v for k, v in _pool(slices).items() if k not in ("rounds", "sustained")}


def _best(cs: list[dict[str, Any]]) -> dict[str, Any]:
    """Capacity: the round with the highest throughput (the least disturbed by the machine)."""
    if not cs:
        return {}
    best = dict(max(cs, key=lambda c: c["achieved_rps"]))
    best["rounds_rps"] = [c["achieved_rps"] for c in cs]
    return best


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Added latency over direct and over both floors, and the goals.

    "floor" is the no-op ext_proc server on grpc.aio; "floor-h2" (the own floor) is the same
    server on the EPP's own transport, the honest floor: over it, the EPP's cost is routing.
    """
    ladder = result["ladder"]
    direct = ladder.get("direct", {})
    floor = ladder.get("floor", {})
    own = ladder.get("floor-h2", {})
    added: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, by_rate in ladder.items():
        if name == "direct":
            continue
        added[name] = {}
        for rate, c in by_rate.items():
            d, f = direct.get(rate), floor.get(rate)
            added[name][rate] = {
                "p50_ms_over_direct": _diff(c.get("p50_ms"), d and d.get("p50_ms")),
                "p99_ms_over_direct": _diff(c.get("p99_ms"), d and d.get("p99_ms")),
                "p50_ms_over_floor": _diff(c.get("p50_ms"), f and f.get("p50_ms")),
                "p99_ms_over_floor": _diff(c.get("p99_ms"), f and f.get("p99_ms")),
            }
            if own:
                o = own.get(rate)
                added[name][rate]["p50_ms_over_own_floor"] = _diff(c.get("p50_ms"), o and o.get("p50_ms"))
                added[name][rate]["p99_ms_over_own_floor"] = _diff(c.get("p99_ms"), o and o.get("p99_ms"))
    judged = _judged(ladder, added, "floor", "p50_ms_over_floor")
    cap = result["capacity"].get("epp", {})
    epp_us = (cap.get("cpu_us_per_req") or {}).get("extproc")
    per_core = round(1e6 / epp_us, 0) if epp_us else None
    worst = judged[1] if judged else None
    out: dict[str, Any] = {
        "added": added,
        "epp_added_p50_ms_over_floor": worst,
        "epp_added_p50_ms_over_floor_at_rate": judged[0] if judged else None,
        "epp_added_p50_ms_over_floor_both_sustained": bool(judged and judged[2]),
        "epp_req_per_s_per_core_at_capacity": per_core,
        "goals": {
            "epp_added_p50_ms_over_floor": {
                "goal": GOALS["epp_added_p50_ms_over_floor"],
                "value": worst,
                "met": worst is not None and worst <= GOALS["epp_added_p50_ms_over_floor"],
            },
            "epp_req_per_s_per_core": {
                "goal": GOALS["epp_req_per_s_per_core"],
                "value": per_core,
                "met": per_core is not None and per_core >= GOALS["epp_req_per_s_per_core"],
            },
        },
    }
    out["hop"] = derive_hop(result)
    if own:
        j = _judged(ladder, added, "floor-h2", "p50_ms_over_own_floor")
        v = j[1] if j else None
        out["epp_added_p50_ms_over_own_floor"] = v
        out["epp_added_p50_ms_over_own_floor_at_rate"] = j[0] if j else None
        out["epp_added_p50_ms_over_own_floor_both_sustained"] = bool(j and j[2])
        out["goals"]["epp_added_p50_ms_over_own_floor"] = {
            "goal": GOALS["epp_added_p50_ms_over_own_floor"],
            "value": v,
            "met": v is not None and v <= GOALS["epp_added_p50_ms_over_own_floor"],
        }
    return out


def derive_hop(result: dict[str, Any]) -> dict[str, Any]:
    """Each EPP path over its fair floor (issue 31), and what the lean Envoy config saves Envoy.

    Ratios are taken within a round (both paths measured minutes apart at most, in the same machine
    state) and the median over rounds is reported; so is the added p50, from each round's slices.
    CPU is split by process: "envoy" and "extproc".
    """
    rounds: dict[str, list[dict[str, Any]]] = result.get("capacity_rounds", {})
    ladder = result["ladder"]
    paths: dict[str, Any] = {}
    goals: list[dict[str, Any]] = []
    for name, floor in result.get("floors", {}).items():
        mine, base = rounds.get(name, []), rounds.get(floor, [])
        if not mine or not base:
            continue
        pairs = list(zip(mine, base, strict=False))
        cpu = _median(
            [_q(a["cpu_us_per_req"].get("total"), b["cpu_us_per_req"].get("total")) for a, b in pairs]
        )
        cap = _median([_q(a["achieved_rps"], b["achieved_rps"]) for a, b in pairs])
        at = str(HOP_RATE)
        pooled = _diff(
            ladder.get(name, {}).get(at, {}).get("p50_ms"), ladder.get(floor, {}).get(at, {}).get("p50_ms")
        )
        by_round = result.get("hop_p50_rounds", {})
        p50_pairs = list(zip(by_round.get(name, []), by_round.get(floor, []), strict=False))
        # the median over rounds of the difference within a round, as the ratios; a result
        # recorded before rounds were kept has only the pooled cells
        p50 = _round(_median([_diff(a, b) for a, b in p50_pairs]), 3) if p50_pairs else pooled
        paths[name] = {
            "floor": floor,
            "rounds": len(pairs),
            "achieved_rps": _median([a["achieved_rps"] for a in mine]),
            "floor_achieved_rps": _median([b["achieved_rps"] for b in base]),
            "cpu_us_per_req": _by_process(mine),
            "floor_cpu_us_per_req": _by_process(base),
            "cpu_ratio": _round(cpu, 3),
            "capacity_ratio": _round(cap, 3),
            "added_p50_ms": p50,
            "added_p50_ms_rounds": [_diff(a, b) for a, b in p50_pairs],
            "added_p50_ms_pooled": pooled,
            "cpu_ratio_vs_gie_floor": _round(
                _median(
                    [
                        _q(a["cpu_us_per_req"].get("total"), b["cpu_us_per_req"].get("total"))
                        for a, b in zip(mine, rounds.get("floor-h2", []), strict=False)
                    ]
                ),
                3,
            ),
        }
        for key, value, better in (
            ("cpu_ratio", cpu, "le"),
            ("capacity_ratio", cap, "ge"),
            ("added_p50_ms", p50, "le"),
        ):
            goal = HOP_GOALS[key]
            met = value is not None and (value <= goal if better == "le" else value >= goal)
            goals.append(
                {"path": name, "floor": floor, "goal": key, "limit": goal, "value": value, "met": met}
            )
    saved: dict[str, Any] = {}
    for config, (gie, lean) in LEAN_PAIRS.items():
        g, ln = rounds.get(gie, []), rounds.get(lean, [])
        if not g or not ln:
            continue
        pg, pl = _by_process(g), _by_process(ln)
        saved[config] = {
            "gie": gie,
            "lean": lean,
            "envoy_us_per_req": {"gie": pg.get("envoy"), "lean": pl.get("envoy")},
            "extproc_us_per_req": {"gie": pg.get("extproc"), "lean": pl.get("extproc")},
            "envoy_share_saved": _round(_saved(pl.get("envoy"), pg.get("envoy")), 3),
            "total_share_saved": _round(_saved(pl.get("total"), pg.get("total")), 3),
        }
    return {"paths": paths, "goals": goals, "lean_saves": saved, "rate": HOP_RATE, "limits": HOP_GOALS}


def _by_process(cs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median over rounds of each process's CPU per request (and the total)."""
    keys = sorted({k for c in cs for k in c["cpu_us_per_req"]})
    return {k: _round(_median([c["cpu_us_per_req"].get(k) for c in cs]), 1) for k in keys}


def _median(xs: list[float | None]) -> float | None:
    vals = sorted(x for x in xs if x is not None)
    return statistics.median(vals) if vals else None


def _q(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _saved(lean: float | None, gie: float | None) -> float | None:
    return 1 - lean / gie if lean is not None and gie else None


def _round(x: float | None, nd: int) -> float | None:
    return round(x, nd) if x is not None else None


def _judged(
    ladder: dict[str, Any], added: dict[str, Any], floor_name: str, key: str
) -> tuple[int, float, bool] | None:
    """(rate, EPP p50 over the floor, both sustained) at the lowest rate both sustain, else the
    lowest rate: above it the floor itself queues and the difference measures queueing, not the EPP."""
    floor = ladder.get(floor_name, {})
    diffs = sorted((int(r), v[key], r) for r, v in added.get("epp", {}).items() if v.get(key) is not None)
    for rate, diff, r in diffs:
        if ladder["epp"][r]["sustained"] and floor.get(r, {}).get("sustained"):
            return rate, diff, True
    return (diffs[0][0], diffs[0][1], False) if diffs else None


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 3) if a is not None and b is not None else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--rounds", type=int, default=0, help="rounds instead of the mode's (medians need 3+)")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    import uvloop

    result = uvloop.run(run(mode, profile=not args.no_profile, rounds=args.rounds or None))
    result["versions"] = versions()
    path = write_result("overhead", result, mode=mode, seeds={"loadgen": SEED})
    log(f"overhead: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
