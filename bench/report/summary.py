"""The report's head: how it was made, and the goals of every comparison with their status."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import time
from typing import Any

from bench.report.findings import findings
from bench.report.fmt import f, met, ratio, table
from bench.report.prefix_routing import prefix_routing_goal_rows


def header(res: dict[str, dict[str, Any] | None], run: dict[str, Any] | None) -> list[str]:
    any_res = next((v for v in res.values() if v and "machine" in v), None)
    m = (run or {}).get("machine") or (any_res or {}).get("machine", {})
    v = (run or {}).get("versions") or (any_res or {}).get("versions", {})
    out = [
        "# Benchmark report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m bench.report` from "
        "`bench/results/*.json`"
        + (
            f", written by `{run['command']}` ({run['mode']} mode, {run['wall_s'] / 60:.1f} min)."
            if run
            else "."
        ),
        "Every comparison was measured in one run on one machine, against a baseline measured in that "
        "same run; "
        "ratios are to that in-run baseline. Absolute numbers depend on the machine (2 cores shared by "
        "the load "
        "generator, the proxies, the EPP and the simulators): read the ratios. How to run and what each "
        "comparison means: [docs/benchmarks.md](../docs/benchmarks.md).",
        "",
        *(
            [
                "> **Quick mode**: a smoke run at tiny scale (one routing rate, short windows, one round). "
                "Its numbers show that every comparison works, not how the EPP compares: `make bench` "
                "produces the published report.",
                "",
            ]
            if run and run.get("mode") == "quick"
            else []
        ),
        "## Goals",
        "",
        table(["comparison", "goal", "measured", "status"], summary_rows(res)),
        "",
        *findings(res),
        "## Machine, versions, seeds, commands",
        "",
        f"- Machine: {m.get('cores')} cores, {m.get('cpu_model')}, {m.get('memory_gib')} GiB, kernel "
        f"{m.get('kernel')}; load average at start {m.get('loadavg_at_start')}.",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
    ]
    seeds = {k: r.get("seeds") for k, r in res.items() if r and r.get("seeds")}
    if seeds:
        out.append("- Seeds: " + "; ".join(f"{k} {s}" for k, s in seeds.items()) + ".")
    if run:
        out.append("- Steps (command, wall time, exit code):")
        out += [f"  - `{s['command']}`: {s['wall_s']:.0f} s, exit {s['exit']}" for s in run.get("steps", [])]
    out.append("")
    return out


def summary_rows(res: dict[str, dict[str, Any] | None]) -> list[list[str]]:
    rows: list[list[str]] = []
    r = res.get("routing")
    if r:
        for name, g in r["derived"]["goals"].items():
            label = r["routers"].get(name, name)
            rows.append(
                [
                    f"1 routing ({label}, {g['at_rate']:g} req/s)",
                    "TTFT p90 ≤ 0.1× round robin",
                    ratio(g["ttft_p90_vs_rr"]["value"]),
                    met(g["ttft_p90_vs_rr"]["met"]),
                ]
            )
            rows.append(
                [
                    f"1 routing ({label})",
                    "peak output tokens/s ≥ 2× round robin",
                    ratio(g["peak_throughput_vs_rr"]["value"]),
                    met(g["peak_throughput_vs_rr"]["met"]),
                ]
            )
            rows.append(
                [
                    f"1 routing ({label}, {g['at_rate']:g} req/s)",
                    "TTFT p90 ≤ 0.8× best peer router",
                    ratio(g["ttft_p90_vs_best_peer"]["value"]),
                    met(g["ttft_p90_vs_best_peer"]["met"]),
                ]
            )
    rows += prefix_routing_goal_rows(res.get("prefix_routing"))
    o = res.get("overhead")
    if o:
        g = o["derived"]["goals"]
        rows.append(
            [
                "2 overhead",
                "EPP adds ≤ 0.3 ms p50 over the no-op ext_proc floor "
                f"(at {o['derived'].get('epp_added_p50_ms_over_floor_at_rate')} req/s, "
                + (
                    "the lowest rate both sustain)"
                    if o["derived"].get("epp_added_p50_ms_over_floor_both_sustained")
                    else "the lowest rate; not sustained by both)"
                ),
                f(g["epp_added_p50_ms_over_floor"]["value"], 2, " ms"),
                met(g["epp_added_p50_ms_over_floor"]["met"]),
            ]
        )
        if "epp_added_p50_ms_over_own_floor" in g:
            d = o["derived"]
            rows.append(
                [
                    "2 overhead",
                    "EPP adds ≤ 0.3 ms p50 over the no-op floor on its own h2 transport "
                    f"(at {d.get('epp_added_p50_ms_over_own_floor_at_rate')} req/s, "
                    + (
                        "the lowest rate both sustain)"
                        if d.get("epp_added_p50_ms_over_own_floor_both_sustained")
                        else "the lowest rate; not sustained by both)"
                    ),
                    f(g["epp_added_p50_ms_over_own_floor"]["value"], 2, " ms"),
                    met(g["epp_added_p50_ms_over_own_floor"]["met"]),
                ]
            )
        rows.append(
            [
                "2 overhead",
                "≥ 1,000 req/s per EPP core (default config, at capacity)",
                f(g["epp_req_per_s_per_core"]["value"], 0, " req/s"),
                met(g["epp_req_per_s_per_core"]["met"]),
            ]
        )
        for h in (o["derived"].get("hop") or {}).get("goals", []):
            what = {"cpu_ratio": "CPU/req at capacity ≤ {}×", "capacity_ratio": "capacity ≥ {}×",
                    "added_p50_ms": "added p50 ≤ {} ms"}[h["goal"]].format(h["limit"])  # fmt: skip
            unit = " ms" if h["goal"] == "added_p50_ms" else "×"
            rows.append(
                ["2 overhead", f"{h['path']}: {what} of {h['floor']}", f(h["value"], 2, unit), met(h["met"])]
            )
    lp = res.get("long_prompts")
    if lp:
        g = lp["derived"]["goals"]["epp_added_p50_ms_over_floor_at_400kb"]
        rows.append(
            [
                "3 long prompts",
                "EPP adds ≤ 10 ms p50 over the floor at 400 KB",
                f(g["value"], 2, " ms"),
                met(g["met"]),
            ]
        )
    s = res.get("streaming")
    if s:
        g = s["goals"]
        rows.append(
            [
                "4 streaming",
                "≥ 50k response chunks/s per EPP core (body plugin, full duplex)",
                f(g["chunks_per_core_s_with_body_plugin"]["value"], 0),
                met(g["chunks_per_core_s_with_body_plugin"]["met"]),
            ]
        )
        rows.append(
            [
                "4 streaming",
                "no per-chunk cost when nothing needs the body (ext_proc msgs per chunk)",
                f(g["zero_per_chunk_cost_when_unneeded"]["value"], 3),
                met(g["zero_per_chunk_cost_when_unneeded"]["met"]),
            ]
        )
    return rows
