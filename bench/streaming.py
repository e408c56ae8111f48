"""Comparison 4, streamed responses: response chunks per second through the EPP and CPU per chunk.

    python -m bench.streaming [--quick]      # writes bench/results/streaming.json

The upstream streams N SSE token events per request, one write every ``chunk_gap_us`` (a fast
decode: Envoy then forwards each event as its own body chunk, as it would for a real model
server; back-to-back writes would be coalesced into fewer, larger chunks).  Closed loop with
concurrent streams, for each path at N = 1 and N = large, so that the per-chunk cost is
``(cpu/request at N - cpu/request at 1) / (messages/request at N - messages/request at 1)``,
free of the per-request cost.  "Chunks" are the response-body messages Envoy sent to the
ext_proc server, read from Envoy's ext_proc counters.

Two Envoy configurations (docs/decisions.md "What each phase costs the proxy"):
* GIE's FULL_DUPLEX_STREAMED both ways: every response chunk reaches the ext_proc server,
  whether or not a plugin needs it;
* request body BUFFERED, response body STREAMED, allow_mode_override: the EPP asks Envoy to skip
  response bodies when no plugin needs them, so the per-chunk cost should be zero.
Each with the default config and with a plugin that needs response bodies (the
request-attribute-reporter of bench/configs/response-body.yaml); Envoy alone and Envoy + the
no-op Python ext_proc server (FULL_DUPLEX_STREAMED, echoing every chunk; on grpc.aio and on the
EPP's own h2 transport, the floor under the EPP) are the baselines.  Each EPP path is also set
against its fair floor: the no-op server on h2 under the same Envoy config, asking for the same
phases (lean: skipping the response, or echoing STREAMED chunks), per streamed event and by
process (the EPP, Envoy).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import log, sum_cpu, versions, write_result
from bench.httpload import closed_loop, summarize
from bench.overhead import chat_requests
from bench.paths import SKIPPABLE, Lab, Path, PathSpec, extproc_messages

SEED = 13
GOAL_CHUNKS_PER_CORE_S = 50_000.0

_SKIP = tuple(SKIPPABLE.items())
SPECS = (
    PathSpec("envoy", "envoy", label="Envoy alone"),
    PathSpec("floor", "floor", label="Envoy + no-op ext_proc (full duplex)"),
    PathSpec(
        "floor-h2", "floor", transport="h2", label="Envoy + no-op ext_proc on the EPP's h2 (full duplex)"
    ),
    PathSpec(
        "floor-h2-lean",
        "floor",
        transport="h2",
        envoy=_SKIP,
        response_phases="none",
        label="Envoy lean + no-op ext_proc on h2, response skipped",
    ),
    PathSpec(
        "floor-h2-lean-full",
        "floor",
        transport="h2",
        envoy=_SKIP,
        label="Envoy lean + no-op ext_proc on h2, STREAMED chunks echoed",
    ),
    PathSpec("epp-fd", "epp", floor="floor-h2", label="EPP default, full duplex (GIE)"),
    PathSpec(
        "epp-fd-body",
        "epp",
        epp_config="response-body.yaml",
        floor="floor-h2",
        label="EPP + body plugin, full duplex",
    ),
    PathSpec(
        "epp-skip", "epp", envoy=_SKIP, floor="floor-h2-lean", label="EPP default, lean Envoy (override)"
    ),
    PathSpec(
        "epp-skip-body",
        "epp",
        epp_config="response-body.yaml",
        envoy=_SKIP,
        floor="floor-h2-lean-full",
        label="EPP + body plugin, lean Envoy (override)",
    ),
)


@dataclass(frozen=True, slots=True)
class Settings:
    chunks: int  # SSE token events per request at "N = large"
    chunk_gap_us: float  # upstream pause between events
    concurrency: int
    window_s: float
    rounds: int


QUICK = Settings(chunks=200, chunk_gap_us=1000.0, concurrency=32, window_s=3.0, rounds=1)
FULL = Settings(chunks=1000, chunk_gap_us=1000.0, concurrency=48, window_s=8.0, rounds=3)


async def measure(path: Path, requests: list[bytes], *, concurrency: int, window: float) -> dict[str, Any]:
    before = await extproc_messages(path)
    meter = path.meter()
    meter.start()
    run = await closed_loop(path.client(), requests, concurrency=concurrency, duration=window)
    cpu = meter.stop()
    after = await extproc_messages(path)
    s: dict[str, Any] = summarize(run)
    ok = max(1, s["ok"])
    events = sum(x.events for x in run.ok)
    s["events"] = events
    s["events_per_s"] = round(events / run.wall, 1) if run.wall else 0.0
    s["cpu_s"] = {k: round(v, 4) for k, v in cpu.items()}
    s["cpu_us_per_req"] = {k: round(v / ok * 1e6, 1) for k, v in cpu.items()}
    sent = after.get("stream_msgs_sent", 0) - before.get("stream_msgs_sent", 0)
    s["extproc_msgs_sent"] = sent
    s["extproc_msgs_per_req"] = round(sent / ok, 2)
    return s


def _merge(ws: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sum(w["ok"] for w in ws)
    wall = sum(w["wall_s"] for w in ws)
    cpu = sum_cpu(ws)
    msgs = sum(w["extproc_msgs_sent"] for w in ws)
    events = sum(w["events"] for w in ws)
    return {
        "rounds": len(ws),
        "ok": ok,
        "errors": sum(w["errors"] for w in ws),
        "req_per_s": round(ok / wall, 1) if wall else 0.0,
        "events_per_s": round(events / wall, 1) if wall else 0.0,
        "events_per_req": round(events / ok, 1) if ok else None,
        "p50_ms": sorted(w["p50_ms"] for w in ws if w["p50_ms"] is not None)[len(ws) // 2] if ok else None,
        "cpu_us_per_req": {k: round(v / ok * 1e6, 1) for k, v in cpu.items()} if ok else {},
        "extproc_msgs_per_req": round(msgs / ok, 2) if ok else None,
        "extproc_msgs_per_s": round(msgs / wall, 1) if wall else 0.0,
    }


async def run(mode: str) -> dict[str, Any]:
    st = QUICK if mode == "quick" else FULL
    reqs = {n: chat_requests(16, 512, SEED, stream=True, max_tokens=n) for n in (1, st.chunks)}
    cells: dict[str, dict[int, list[dict[str, Any]]]] = {s.name: {} for s in SPECS}
    async with Lab(SPECS, chunk_gap_us=st.chunk_gap_us) as lab:
        idle = lab.idle_report()
        paths = list(lab.paths.values())
        log("streaming: warming up")
        for p in paths:
            await closed_loop(p.client(), reqs[1], concurrency=4, duration=0.3)
        for rnd in range(st.rounds):
            order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
            for n in (1, st.chunks):
                for p in order:
                    w = await measure(p, reqs[n], concurrency=st.concurrency, window=st.window_s)
                    cells[p.name].setdefault(n, []).append(w)
                    log(
                        f"streaming: round {rnd + 1}/{st.rounds} N={n:<5} {p.name:<14} "
                        f"{w['events_per_s']:>9} events/s "
                        f"{w['extproc_msgs_per_req']:>7} ext_proc msgs/req, "
                        f"ext_proc cpu {w['cpu_us_per_req'].get('extproc', 0)} us/req"
                    )
    table = {name: {str(n): _merge(ws) for n, ws in sorted(v.items())} for name, v in cells.items()}
    per_chunk: dict[str, dict[str, float | None]] = {}
    for name, by_n in table.items():
        one, big = by_n["1"], by_n[str(st.chunks)]
        extra_msgs = (big["extproc_msgs_per_req"] or 0) - (one["extproc_msgs_per_req"] or 0)
        row: dict[str, float | None] = {"extproc_msgs_per_event": round(extra_msgs / (st.chunks - 1), 3)}
        for proc in ("extproc", "envoy"):
            a = one["cpu_us_per_req"].get(proc)
            b = big["cpu_us_per_req"].get(proc)
            if a is None or b is None:
                continue
            row[f"{proc}_us_per_event"] = round((b - a) / (st.chunks - 1), 3)
            row[f"{proc}_us_per_chunk"] = round((b - a) / extra_msgs, 2) if extra_msgs >= 1 else None
        us = row.get("extproc_us_per_chunk")
        row["chunks_per_core_s"] = round(1e6 / us, 0) if us and us > 0 else None
        ev = [row.get(f"{proc}_us_per_event") for proc in ("extproc", "envoy")]
        row["us_per_event"] = (
            round(sum(x for x in ev if x is not None), 3) if any(x is not None for x in ev) else None
        )
        per_chunk[name] = row
    for spec in SPECS:  # each EPP path against its fair floor, per streamed event (Envoy + ext_proc)
        if spec.floor and spec.floor in per_chunk:
            mine, floor = per_chunk[spec.name], per_chunk[spec.floor]
            mine["us_per_event_over_floor"] = _minus(mine.get("us_per_event"), floor.get("us_per_event"))
            mine["envoy_us_per_event_over_floor"] = _minus(
                mine.get("envoy_us_per_event"), floor.get("envoy_us_per_event")
            )
            mine["extproc_us_per_event_over_floor"] = _minus(
                mine.get("extproc_us_per_event"), floor.get("extproc_us_per_event")
            )
    fd = per_chunk.get("epp-fd-body", {}).get("chunks_per_core_s")
    skip_msgs = per_chunk.get("epp-skip", {}).get("extproc_msgs_per_event")
    return {
        "idle_cores": idle,
        "settings": asdict(st),
        "paths": {s.name: s.title for s in SPECS},
        "floors": {s.name: s.floor for s in SPECS if s.floor},
        "table": table,
        "per_chunk": per_chunk,
        "goals": {
            "chunks_per_core_s_with_body_plugin": {
                "goal": GOAL_CHUNKS_PER_CORE_S,
                "value": fd,
                "met": fd is not None and fd >= GOAL_CHUNKS_PER_CORE_S,
            },
            "zero_per_chunk_cost_when_unneeded": {
                "goal": "no ext_proc message per chunk (epp-skip)",
                "value": skip_msgs,
                "met": skip_msgs is not None and skip_msgs <= 0.001,
            },
        },
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return round(a - b, 3) if a is not None and b is not None else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    import uvloop

    result = uvloop.run(run(mode))
    result["versions"] = versions()
    log(f"streaming: wrote {write_result('streaming', result, mode=mode, seeds={'bodies': SEED})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
