"""Comparison 3, long prompts: what Envoy + EPP adds for request bodies from 4 KB to 400 KB.

    python -m bench.long_prompts [--quick]      # writes bench/results/long_prompts.json

Paths (a) direct, (b) Envoy alone, (c) Envoy + the no-op Python ext_proc server and (d) Envoy +
the EPP (default config: the body is parsed and its prefix hashed).  Per body size an open-loop
Poisson window at a low rate (latency is then the cost of the path, not queueing), paths
interleaved, rounds rotated.  Then GIE's reported case (#2928): 220 KB prompts at concurrency 20,
closed loop, where the Go EPP path added 158 ms mean TTFT.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import log, versions, write_result
from bench.httpload import closed_loop
from bench.overhead import _diff, _pool, _record, chat_requests, measure
from bench.paths import DIRECT, ENVOY, EPP, FLOOR, Lab

SEED = 11
GOAL_MS_AT_400KB = 10.0
GO_EPP_ADDED_MS_220KB_C20 = 158.0


@dataclass(frozen=True, slots=True)
class Settings:
    sizes_kb: tuple[int, ...]
    rate: float
    window_s: float
    rounds: int
    c20_window_s: float


QUICK = Settings(sizes_kb=(4, 100, 400), rate=10.0, window_s=3.0, rounds=1, c20_window_s=3.0)
FULL = Settings(sizes_kb=(4, 16, 64, 220, 400), rate=10.0, window_s=6.0, rounds=3, c20_window_s=6.0)


async def run(mode: str) -> dict[str, Any]:
    st = QUICK if mode == "quick" else FULL
    specs = [DIRECT, ENVOY, FLOOR, EPP]
    bodies = {kb: chat_requests(8, kb * 1000, SEED + kb) for kb in st.sizes_kb}
    cells: dict[str, dict[int, list[dict[str, Any]]]] = {s.name: {} for s in specs}
    c20: dict[str, dict[str, Any]] = {}
    async with Lab(specs) as lab:
        idle = lab.idle_report()
        paths = list(lab.paths.values())
        log("long prompts: warming up")
        for p in paths:
            await closed_loop(p.client(), bodies[st.sizes_kb[0]], concurrency=4, duration=0.5)
        for rnd in range(st.rounds):
            order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
            for kb in st.sizes_kb:
                for p in order:
                    w = await measure(
                        p, bodies[kb], rate=st.rate, window=st.window_s, seed=SEED + rnd * 100 + kb
                    )
                    cells[p.name].setdefault(kb, []).append(w)
                    log(
                        f"long prompts: round {rnd + 1}/{st.rounds} {kb:>4} KB {p.name:<8} "
                        f"p50 {w['p50_ms']} ms "
                        f"p99 {w['p99_ms']} ms ok {w['ok']}/{w['offered']}"
                    )
        big = bodies.get(220) or chat_requests(8, 220_000, SEED + 220)
        for p in paths:
            meter = p.meter()
            meter.start()
            cl = await closed_loop(p.client(), big, concurrency=20, duration=st.c20_window_s)
            c = _record(cl, meter.stop())
            c.pop("_lat_ms")
            c20[p.name] = c
            log(
                f"long prompts: 220 KB at concurrency 20 {p.name:<8} "
                f"mean {c['mean_ms']} ms p50 {c['p50_ms']} ms"
            )
    by_size = {name: {str(kb): _pool(ws) for kb, ws in sorted(v.items())} for name, v in cells.items()}
    added: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in ("envoy", "floor", "epp"):
        added[name] = {}
        for size, c in by_size[name].items():
            d, f = by_size["direct"][size], by_size["floor"][size]
            added[name][size] = {
                "p50_ms_over_direct": _diff(c["p50_ms"], d["p50_ms"]),
                "p99_ms_over_direct": _diff(c["p99_ms"], d["p99_ms"]),
                "p50_ms_over_floor": _diff(c["p50_ms"], f["p50_ms"]),
                "p99_ms_over_floor": _diff(c["p99_ms"], f["p99_ms"]),
            }
    at400 = added["epp"].get("400", {}).get("p50_ms_over_floor")
    c20_added = _diff(c20.get("epp", {}).get("mean_ms"), c20.get("direct", {}).get("mean_ms"))
    return {
        "idle_cores": idle,
        "settings": asdict(st),
        "paths": {s.name: s.title for s in specs},
        "by_size": by_size,
        "concurrency_20_at_220kb": c20,
        "derived": {
            "added": added,
            "epp_added_mean_ms_220kb_c20_over_direct": c20_added,
            "go_epp_added_mean_ttft_ms_220kb_c20": GO_EPP_ADDED_MS_220KB_C20,
            "goals": {
                "epp_added_p50_ms_over_floor_at_400kb": {
                    "goal": GOAL_MS_AT_400KB,
                    "value": at400,
                    "met": at400 is not None and at400 <= GOAL_MS_AT_400KB,
                },
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.long_prompts", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    import uvloop

    result = uvloop.run(run(mode))
    result["versions"] = versions()
    log(f"long prompts: wrote {write_result('long_prompts', result, mode=mode, seeds={'bodies': SEED})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
