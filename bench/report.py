"""Build bench/REPORT.md and bench/plots/*.png from bench/results/*.json (re-runnable on old results).

python -m bench.report
"""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import BENCH, PLOTS, log, read_result

REPORT = BENCH / "REPORT.md"


# ---------------------------------------------------------------------------------------------
# formatting


def f(x: Any, nd: int = 1, unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) and not nd:
        return f"{x:,}{unit}"
    if isinstance(x, (int, float)):
        if abs(x) >= 1000 and nd <= 1:
            return f"{x:,.0f}{unit}"
        return f"{x:.{nd}f}{unit}"
    return str(x)


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def met(m: Any) -> str:
    return "**met**" if m else "not met"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, name: str) -> str:
    PLOTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(PLOTS / name, dpi=110)
    _plt().close(fig)
    return f"plots/{name}"


def profile_section(prof: dict[str, Any] | None, title: str, top: int = 10) -> list[str]:
    if not prof:
        return []
    if "error" in prof:
        return [f"*{title}: profile not available ({prof['error']}).*", ""]
    rows = [[f"`{e['function']}`", f"{e['share']:.1%}"] for e in prof["self"][:top]]
    incl = [[f"`{e['function']}`", f"{e['share']:.1%}"] for e in prof["inclusive"][:top]]
    return [
        f"**{title}** ({prof['samples']:,} py-spy samples of busy threads)",
        "",
        "Self time (where the CPU is spent):",
        "",
        table(["function", "share"], rows),
        "",
        "Inclusive time (what the time is spent under):",
        "",
        table(["function", "share"], incl),
        "",
    ]


# ---------------------------------------------------------------------------------------------
# sections


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
        rows.append(
            [
                "2 overhead",
                "≥ 1,000 req/s per EPP core (default config, at capacity)",
                f(g["epp_req_per_s_per_core"]["value"], 0, " req/s"),
                met(g["epp_req_per_s_per_core"]["met"]),
            ]
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


def routing_section(r: dict[str, Any]) -> list[str]:
    wl, st = r["workload"], r["settings"]
    cells = [c for c in r["cells"] if "failed" not in c]
    failed = [c for c in r["cells"] if "failed" in c]
    ratios = r["derived"]["ratios"]
    out = [
        "## 1. Routing quality",
        "",
        f"llm-d-style shared-prefix workload on {wl['replicas']} simulated vLLM replicas (`epp-sim`, time "
        "scale "
        f"{wl['time_scale']:g}: modelled GPU time runs in real time). {wl['groups']} groups × a shared "
        "system prompt of "
        f"{wl['system_tokens']:,} tokens, then a distinct {wl['question_tokens']}-token question; "
        f"{wl['output_tokens']} output tokens. KV cache {wl['kv_blocks']:,} blocks × {wl['block_size']} "
        "tokens per "
        f"replica: the working set ({wl['working_set_tokens']:,} tokens) is "
        f"**{wl['working_set_over_fleet_kv']:.2f}× "
        f"the whole fleet's KV capacity** and {wl['working_set_over_replica_kv']:.1f}× one replica's, so a "
        "router "
        "that spreads a group over the fleet makes every replica thrash. Each cell runs on a fresh fleet "
        "(cold "
        f"caches, same seed) with the same request sequence; Poisson arrivals for {st['duration_s']} s per "
        "rate. "
        f"Load generator: **{st['loadgen']}**. Baseline: Envoy round robin, measured in the same run.",
        "",
    ]
    out += [f"- {n}" for n in r.get("notes", [])]
    if r.get("notes"):
        out.append("")
    rows = []
    for c in sorted(cells, key=lambda c: (c["rate"], list(r["routers"]).index(c["router"]))):
        rt = ratios.get(c["router"], {}).get(str(c["rate"]), {})
        rows.append(
            [
                f"{c['rate']:g}",
                r["routers"].get(c["router"], c["router"]),
                f(c["ttft_ms"]["p50"], 0),
                f(c["ttft_ms"]["p90"], 0),
                f(c["ttft_ms"]["p99"], 0),
                f(c["itl_ms"]["p50"], 1),
                f(c["output_tokens_per_s"], 0),
                f"{c['success_rate']:.1%}",
                f"{c['fleet']['prefix_hit_rate']:.0%}",
                f(c["fleet"]["load_imbalance_max_over_mean"], 2),
                ratio(rt.get("ttft_p90_vs_rr")),
                ratio(rt.get("throughput_vs_rr")),
                ratio(rt.get("ttft_p90_vs_best_peer")),
            ]
        )
    out += [
        table(
            [
                "req/s",
                "router",
                "TTFT p50 ms",
                "p90",
                "p99",
                "ITL p50 ms",
                "output tok/s",
                "success",
                "cache hits",
                "load max/mean",
                "TTFT p90 / RR",
                "tok/s / RR",
                "TTFT p90 / best peer",
            ],
            rows,
        ),
        "",
        "Peak output tokens/s over the rate ladder: "
        + ", ".join(
            f"{r['routers'].get(k, k)} {f(v, 0)}" for k, v in r["derived"]["peak_output_tokens_per_s"].items()
        )
        + ".",
        "",
    ]
    for c in failed:
        out.append(
            f"- {r['routers'].get(c['router'], c['router'])} at {c['rate']:g} req/s failed: "
            f"`{c['failed'][:300]}`"
        )
    if failed:
        out.append("")
    img = plot_routing(r, cells)
    if img:
        out += [f"![TTFT p90 and output throughput vs request rate]({img})", ""]
    for c in cells:
        if c.get("profile"):
            out += profile_section(
                c["profile"], f"EPP profile under the routing workload ({c['router']}, {c['rate']:g} req/s)"
            )
    return out


def plot_routing(r: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    if not cells:
        return ""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, label in r["routers"].items():
        pts = sorted((c["rate"], c) for c in cells if c["router"] == name)
        if not pts:
            continue
        xs = [x for x, _ in pts]
        a.plot(xs, [c["ttft_ms"]["p90"] for _, c in pts], marker="o", label=label)
        b.plot(xs, [c["output_tokens_per_s"] for _, c in pts], marker="o", label=label)
    a.set_yscale("log")
    a.set_xlabel("request rate (req/s)")
    a.set_ylabel("TTFT p90 (ms, log)")
    a.set_title("Time to first token, p90")
    b.set_xlabel("request rate (req/s)")
    b.set_ylabel("output tokens/s")
    b.set_title("Output throughput")
    a.grid(True, alpha=0.3)
    b.grid(True, alpha=0.3)
    b.legend(fontsize=7)
    return _save(fig, "routing.png")


def overhead_section(o: dict[str, Any]) -> list[str]:
    st, paths = o["settings"], o["paths"]
    added = o["derived"]["added"]
    out = [
        "## 2. Overhead of the routing hop",
        "",
        f"Near-instant upstreams ({st['upstreams']}, bench/upstream.py), {st['request_bytes']:,}-byte chat "
        "requests, "
        f"non-streamed answers. Open-loop Poisson windows of {st['window_s']:g} s per (path, rate), "
        f"{st['rounds']} round(s), paths interleaved and their order rotated per round; latency from the "
        "scheduled "
        "send time. CPU is the routing processes' utime+stime per successful request, less their idle rate "
        f"(measured before the load; the EPP's 50 ms metric scrapes). Sustained: {st['sustain_rule']}. "
        "Added latency is the path's percentile minus the direct path's, at the same rate in the same run.",
        "",
    ]
    out += [f"- {n}" for n in o.get("notes", [])]
    rates = sorted({int(k) for v in o["ladder"].values() for k in v})
    rows = []
    for rate in rates:
        for name, title in paths.items():
            c = o["ladder"].get(name, {}).get(str(rate))
            if not c:
                continue
            a = added.get(name, {}).get(str(rate), {})
            cpu = c["cpu_us_per_req"]
            rows.append(
                [
                    str(rate),
                    title,
                    f(c["p50_ms"], 2),
                    f(c["p99_ms"], 2),
                    f(a.get("p50_ms_over_direct"), 2),
                    f(a.get("p99_ms_over_direct"), 2),
                    f(a.get("p50_ms_over_floor"), 2),
                    f(cpu.get("total"), 0),
                    f(cpu.get("extproc") or cpu.get("router"), 0),
                    f"{c['ok']}/{c['offered']}",
                    "yes" if c["sustained"] else "**no**",
                ]
            )
    out += [
        "",
        table(
            [
                "req/s",
                "path",
                "p50 ms",
                "p99 ms",
                "added p50",
                "added p99",
                "p50 over floor",
                "CPU µs/req (all)",
                "CPU µs/req (ext_proc or router)",
                "ok/offered",
                "sustained",
            ],
            rows,
        ),
        "",
    ]
    cap = o["capacity"]
    env = cap.get("envoy", {})
    floor = cap.get("floor", {})
    rows = []
    for name, title in paths.items():
        c = cap.get(name)
        if not c:
            continue
        cpu = c["cpu_us_per_req"]
        own = cpu.get("extproc") or cpu.get("router")
        rows.append(
            [
                title,
                f(c["achieved_rps"], 0),
                ratio(_r(c["achieved_rps"], env.get("achieved_rps"))),
                ratio(_r(c["achieved_rps"], floor.get("achieved_rps"))),
                f(cpu.get("total"), 0),
                f(own, 0),
                f(1e6 / own, 0) if own else "–",
                f(o["max_sustained_rps"].get(name), 0),
            ]
        )
    out += [
        f"Capacity: closed loop, {st['concurrency']} concurrent requests, {st['capacity_s']:g} s, best of "
        "the rounds.",
        "",
        table(
            [
                "path",
                "max req/s",
                "vs Envoy alone",
                "vs floor",
                "CPU µs/req (all)",
                "CPU µs/req (ext_proc or router)",
                "req/s per core of that process",
                "max sustained open-loop rate",
            ],
            rows,
        ),
        "",
    ]
    img = plot_overhead(o)
    if img:
        out += [f"![Added latency over the direct path vs request rate]({img})", ""]
    prof = o.get("profile") or {}
    if "python" in prof or "native" in prof:
        out += [
            "Profiles of the EPP under this load (default config, open loop). Python frames are sampled "
            "without pausing the process; there, self time in `Runner.run` or `Thread.run` is native code "
            "running under those frames (uvloop's loop, syscalls, protobuf; with "
            "--ext-proc-transport=grpcio also grpc's C core). The "
            "native profile (py-spy `--native`, which pauses the process per sample) splits that time by C "
            "function and syscall; waits (`epoll_wait`, futexes) are left out of its shares.",
            "",
        ]
        out += profile_section(prof.get("python"), "Python frames")
        out += profile_section(prof.get("native"), "Native frames")
    else:
        out += profile_section(prof, "EPP profile under the overhead load (default config)")
    return out


def _r(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def plot_overhead(o: dict[str, Any]) -> str:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, title in o["paths"].items():
        if name == "direct":
            continue
        pts = sorted((int(k), v) for k, v in o["derived"]["added"].get(name, {}).items())
        xs = [x for x, _ in pts]
        a.plot(xs, [max(v["p50_ms_over_direct"] or 0.001, 0.001) for _, v in pts], marker="o", label=title)
        b.plot(xs, [max(v["p99_ms_over_direct"] or 0.001, 0.001) for _, v in pts], marker="o", label=title)
    for ax, q in ((a, "p50"), (b, "p99")):
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(f"added {q} latency over direct (ms, log)")
        ax.set_title(f"Added latency, {q}")
        ax.grid(True, alpha=0.3)
    b.legend(fontsize=7)
    return _save(fig, "overhead.png")


def long_prompts_section(lp: dict[str, Any]) -> list[str]:
    st, paths = lp["settings"], lp["paths"]
    added = lp["derived"]["added"]
    out = [
        "## 3. Long prompts",
        "",
        f"Chat requests with bodies from {st['sizes_kb'][0]} KB to {st['sizes_kb'][-1]} KB, open loop at "
        f"{st['rate']:g} req/s ({st['window_s']:g} s windows, {st['rounds']} round(s), paths interleaved). "
        "The EPP "
        "parses every body and hashes its prefix (default config).",
        "",
    ]
    rows = []
    for kb in st["sizes_kb"]:
        for name, title in paths.items():
            c = lp["by_size"].get(name, {}).get(str(kb))
            if not c:
                continue
            a = added.get(name, {}).get(str(kb), {})
            rows.append(
                [
                    str(kb),
                    title,
                    f(c["p50_ms"], 2),
                    f(c["p99_ms"], 2),
                    f(a.get("p50_ms_over_direct"), 2),
                    f(a.get("p99_ms_over_direct"), 2),
                    f(a.get("p50_ms_over_floor"), 2),
                    f(a.get("p99_ms_over_floor"), 2),
                    f((c["cpu_us_per_req"].get("extproc")), 0),
                ]
            )
    out += [
        table(
            [
                "KB",
                "path",
                "p50 ms",
                "p99 ms",
                "added p50",
                "added p99",
                "p50 over floor",
                "p99 over floor",
                "ext_proc CPU µs/req",
            ],
            rows,
        ),
        "",
    ]
    c20 = lp["concurrency_20_at_220kb"]
    d = c20.get("direct", {})
    rows = [
        [
            paths[n],
            f(c.get("mean_ms"), 1),
            f(c.get("p50_ms"), 1),
            f(_diff(c.get("mean_ms"), d.get("mean_ms")), 1),
            f(c.get("achieved_rps"), 0),
        ]
        for n, c in c20.items()
    ]
    out += [
        "GIE's reported case (#2928): 220 KB prompts at concurrency 20, closed loop "
        f"({st['c20_window_s']:g} s). "
        f"The Go EPP path added {lp['derived']['go_epp_added_mean_ttft_ms_220kb_c20']:g} ms mean TTFT there "
        "(Istio, 4 near-instant simulators; a different machine).",
        "",
        table(["path", "mean ms", "p50 ms", "added mean over direct", "req/s"], rows),
        "",
    ]
    img = plot_long(lp)
    if img:
        out += [f"![Latency vs request body size]({img})", ""]
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def plot_long(lp: dict[str, Any]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, title in lp["paths"].items():
        pts = sorted((int(k), v) for k, v in lp["by_size"].get(name, {}).items())
        ax.plot([x for x, _ in pts], [v["p50_ms"] for _, v in pts], marker="o", label=f"{title} p50")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("request body (KB, log)")
    ax.set_ylabel("latency p50 (ms, log)")
    ax.set_title("Latency vs prompt size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, "long_prompts.png")


def streaming_section(s: dict[str, Any]) -> list[str]:
    st, paths = s["settings"], s["paths"]
    n = str(st["chunks"])
    out = [
        "## 4. Streamed responses",
        "",
        f"The upstream streams {st['chunks']:,} SSE token events per request, one every "
        f"{st['chunk_gap_us']:g} µs; "
        f"{st['concurrency']} concurrent streams, closed loop, {st['window_s']:g} s windows, "
        f"{st['rounds']} round(s). "
        "A *chunk* is a response-body message Envoy sent to the ext_proc server (Envoy's ext_proc counters; "
        "Envoy merges events that arrive together). Per-chunk CPU = (CPU per request with N events − CPU per "
        "request with 1 event) / (extra messages per request), so per-request costs cancel.",
        "",
    ]
    rows = []
    for name, title in paths.items():
        big = s["table"][name][n]
        one = s["table"][name]["1"]
        pc = s["per_chunk"][name]
        rows.append(
            [
                title,
                f(big["events_per_s"], 0),
                f(big["extproc_msgs_per_req"], 1),
                f(one["extproc_msgs_per_req"], 1),
                f(pc.get("extproc_us_per_chunk"), 1),
                f(pc.get("chunks_per_core_s"), 0),
                f(pc.get("extproc_us_per_event"), 2),
                f(pc.get("envoy_us_per_event"), 2),
            ]
        )
    out += [
        table(
            [
                "path",
                "events/s (client)",
                f"ext_proc msgs/req (N={n})",
                "msgs/req (N=1)",
                "ext_proc µs/chunk",
                "chunks per ext_proc core-s",
                "ext_proc µs/event",
                "Envoy µs/event",
            ],
            rows,
        ),
        "",
    ]
    img = plot_streaming(s)
    if img:
        out += [f"![Streaming: events per second and ext_proc CPU per event]({img})", ""]
    return out


def plot_streaming(s: dict[str, Any]) -> str:
    plt = _plt()
    n = str(s["settings"]["chunks"])
    names = list(s["paths"])
    labels = [s["paths"][k] for k in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.barh(labels, [s["table"][k][n]["events_per_s"] for k in names])
    a.set_xlabel("SSE events/s delivered to the client")
    a.set_title(f"Streamed events/s (N={n} per request)")
    b.barh(labels, [max(0.0, s["per_chunk"][k].get("extproc_us_per_event") or 0.0) for k in names])
    b.set_xlabel("ext_proc server CPU µs per streamed event")
    b.set_title("ext_proc CPU per event")
    for ax in (a, b):
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="y", labelsize=7)
    return _save(fig, "streaming.png")


def micro_section(res: dict[str, dict[str, Any] | None]) -> list[str]:
    out = [
        "## 5. Scale of the decision (micro-benchmarks)",
        "",
        "Run by the same harness from their own modules (`python -m bench.<name>`); each measures its "
        "baseline in the same run.",
        "",
    ]
    sch = res.get("scheduler")
    if sch:
        rows = [
            [
                f(c["endpoints"], 0),
                f(c["prompt_chars"], 0),
                f(c["prepare_us"]["p50"]),
                f(c["schedule_us"]["p50"]),
                f(c["total_us"]["p50"]),
                f(c["total_us"]["p99"]),
                f(c["pre_request_us"]["p50"]),
            ]
            for c in sch["cells"]
        ]
        g = sch.get("goals", {})
        out += [
            f"**Scheduler** ({sch.get('mode')} mode; {sch.get('profile', '')}), µs:",
            "",
            table(
                [
                    "endpoints",
                    "prompt chars",
                    "prepare p50",
                    "schedule p50",
                    "total p50",
                    "total p99",
                    "pre-request p50",
                ],
                rows,
            ),
            "",
            "Goals (µs): "
            + "; ".join(
                f"`{k}` goal {v.get('goal')}, measured "
                + ", ".join(f"{kk} {vv}" for kk, vv in v.items() if kk != "goal")
                for k, v in g.items()
                if isinstance(v, dict)
            ),
            "",
        ]
    scr = res.get("scrape")
    if scr:
        rows = [
            [
                r["loop"],
                r["page"],
                f(r["endpoints"], 0),
                f(r["scrapes_per_s"], 0),
                f(r["cores"], 3),
                f(r["cpu_us_per_scrape"], 0),
            ]
            for r in scr.get("runtime", [])
        ]
        parse = [
            [
                p["page"],
                f(p["bytes"], 0),
                f(p["ours_wanted_us"]),
                f(p["prometheus_client_us"]),
                ratio(_r(p["prometheus_client_us"], p["ours_wanted_us"])),
            ]
            for p in scr.get("parse", [])
        ]
        out += [
            f"**Metric scraping** ({scr.get('mode')} mode; goal ≤ {scr.get('goal_cores')} cores for 100 "
            "endpoints "
            "every 50 ms):",
            "",
            table(["loop", "page", "endpoints", "scrapes/s", "cores", "CPU µs/scrape"], rows),
            "",
            table(["page", "bytes", "ours µs", "prometheus_client µs (baseline)", "speed-up"], parse),
            "",
        ]
    par = res.get("parsers")
    if par:
        rows = [
            [
                f(c["bytes"], 0),
                "yes" if c["nested_model_key"] else "no",
                f(c["parse_us"]["p50"]),
                f(c["baseline_orjson_loads_us"]["p50"]),
                f(c["serialize_unchanged_us"]["p50"], 2),
                f(c["serialize_rewritten_us"]["p50"]),
                f(c["baseline_orjson_dumps_us"]["p50"]),
            ]
            for c in par.get("chat_bodies", [])
        ]
        sse = par.get("sse", {})
        out += [
            f"**Parsers** ({par.get('mode')} mode), µs p50:",
            "",
            table(
                [
                    "body bytes",
                    "nested model key",
                    "parse",
                    "orjson.loads (baseline)",
                    "serialize unchanged",
                    "serialize rewritten",
                    "orjson.dumps (baseline)",
                ],
                rows,
            ),
            "",
            "SSE usage parser per chunk: "
            + ", ".join(f"{k} {f(v['us']['p50'], 2)} µs" for k, v in sse.items()),
            "",
        ]
    fc = res.get("flowcontrol")
    if fc:
        fp = fc["fast_path"]
        rows = [
            [t["fairness"], t["ordering"], f(t["enqueues_per_s"], 0), f(t["dispatches_per_s"], 0)]
            for t in fc.get("throughput", [])
        ]
        out += [
            f"**Flow control** ({fc.get('mode')} mode): admission fast path p50 "
            f"{f(fp['flow_control_us']['p50'])} µs vs "
            f"legacy admission {f(fp['legacy_admission_us']['p50'])} µs (baseline, "
            f"{ratio(fp['ratio_p50'])}); "
            f"hand-off p50 {f(fc['handoff']['notify_to_dispatched_us']['p50'])} µs; "
            f"{f(fc['memory']['bytes_per_queued_request'], 0)} B per queued request.",
            "",
            table(["fairness", "ordering", "enqueues/s", "dispatches/s"], rows),
            "",
        ]
    sim = res.get("sim_cost")
    if sim:
        rows = [
            [
                p["name"],
                f(p["rate"], 0),
                f(p["achieved_rate"], 1),
                f(p["tokens_per_s"], 0),
                f(p["sim_cores"], 3),
            ]
            for p in sim.get("phases", [])
        ]
        t = sim.get("target", {})
        out += [
            f"**Simulator cost** ({sim.get('mode')} mode): {f(sim.get('cpu_us_per_request'), 0)} µs per "
            "request, "
            f"{f(sim.get('cpu_us_per_streamed_token'), 1)} µs per streamed token; target "
            f"{f(t.get('rate'), 0)} req/s under {t.get('max_cores')} cores: {met(t.get('pass'))} "
            f"({f(t.get('sim_cores'), 3)} cores).",
            "",
            table(["phase", "req/s offered", "achieved", "tokens/s", "simulator cores"], rows),
            "",
        ]
    return out


_LOOP_FRAMES = ("Runner.run (", "Thread.run (", "run (uvloop", "<module>")


def _top_own(prof: dict[str, Any] | None, n: int = 4) -> str:
    """The costliest functions by self time, without the frames that stand for native loop work."""
    if not prof or "self" not in prof:
        return ""
    rows = [e for e in prof["self"] if not e["function"].startswith(_LOOP_FRAMES)][:n]
    return ", ".join(f"`{e['function']}` {e['share']:.0%}" for e in rows)


def findings(res: dict[str, dict[str, Any] | None]) -> list[str]:
    """What the numbers say, computed from them (so a re-run rewrites it)."""
    out: list[str] = []
    r = res.get("routing")
    cells = [c for c in (r or {}).get("cells", []) if "failed" not in c]
    if r and cells:
        top = max(c["rate"] for c in cells)
        at = {c["router"]: c for c in cells if c["rate"] == top}
        rr = at.get("round-robin")
        parts = []
        for name in ("epp-default", "epp-prefix"):
            c = at.get(name)
            if c and rr:
                parts.append(
                    f"{r['routers'][name]}: TTFT p90 {f(c['ttft_ms']['p90'], 0)} ms vs round robin "
                    f"{f(rr['ttft_ms']['p90'], 0)} ms "
                    f"({ratio(_r(c['ttft_ms']['p90'], rr['ttft_ms']['p90']))}), "
                    f"cache hits {c['fleet']['prefix_hit_rate']:.0%} vs {rr['fleet']['prefix_hit_rate']:.0%}"
                )
        peers = [c for n, c in at.items() if n not in ("epp-default", "epp-prefix", "round-robin")]
        if peers:
            best = min(peers, key=lambda c: c["ttft_ms"]["p90"] or float("inf"))
            parts.append(
                f"best peer {r['routers'][best['router']]}: TTFT p90 {f(best['ttft_ms']['p90'], 0)} ms, "
                f"cache hits {best['fleet']['prefix_hit_rate']:.0%}"
            )
        if parts:
            out.append(f"- **Routing** at {top:g} req/s: " + "; ".join(parts) + ".")
        for c in cells:
            cpu = (c.get("router_cpu_s") or {}).get("epp")
            if c["router"] == "epp-default" and c["rate"] == top and cpu and c.get("ok"):
                idle = c.get("epp_idle_cores")
                out.append(
                    f"- **EPP CPU on the routing workload**: {cpu / c['ok'] * 1e3:.1f} ms per streamed "
                    f"request ({c['ok']} requests with {r['workload']['output_tokens']} tokens each at "
                    f"{top:g} req/s; "
                    "response chunks included"
                    + (
                        f"; plus {f(idle, 3)} cores when idle, scraping the replicas' metrics)."
                        if idle
                        else ")."
                    )
                )
        for c in cells:
            if c.get("profile") and _top_own(c["profile"]):
                selfs = c["profile"].get("self", [])
                loop = sum(e["share"] for e in selfs if e["function"].startswith(_LOOP_FRAMES))
                out.append(
                    f"- **Top Python costs, routing workload** ({c['router']}, {c['rate']:g} req/s): "
                    f"{_top_own(c['profile'])}; {loop:.0%} of the busy samples are native code under the "
                    "event loop (syscalls, uvloop, protobuf)."
                )
    o = res.get("overhead")
    if o:
        cap = o.get("capacity", {})
        epp = (cap.get("epp", {}).get("cpu_us_per_req") or {}).get("extproc")
        floor = (cap.get("floor", {}).get("cpu_us_per_req") or {}).get("extproc")
        if epp and floor and epp <= floor:
            out.append(
                f"- **Where the EPP's CPU goes** (overhead, at capacity): {f(epp, 0)} µs per request, "
                f"everything included, against {f(floor, 0)} µs for the no-op ext_proc floor on grpc.aio: "
                "the EPP's own HTTP/2 transport (docs/decisions.md) saves more than parsing, prefix "
                "hashing, scheduling and metrics cost."
            )
        elif epp and floor:
            out.append(
                f"- **Where the EPP's CPU goes** (overhead, at capacity): {f(epp, 0)} µs per request, of "
                "which the "
                f"no-op ext_proc floor (grpc.aio + protobuf + the protocol's messages) is {f(floor, 0)} µs "
                f"({floor / epp:.0%}); the EPP's own work (parse, prefix hashing, scheduling, metrics) is "
                "the rest, "
                f"{f(epp - floor, 0)} µs."
            )
        prof = o.get("profile") or {}
        py, nat = _top_own(prof.get("python")), _top_own(prof.get("native"))
        if py or nat:
            out.append(
                "- **Top costs in the EPP's profile** (overhead load): Python: "
                + (py or "–")
                + "; native: "
                + (nat or "–")
                + "."
            )
    s = res.get("streaming")
    if s:
        pc = s.get("per_chunk", {})
        fd, fl, skip = pc.get("epp-fd-body", {}), pc.get("floor", {}), pc.get("epp-skip", {})
        if (
            fd.get("extproc_us_per_chunk")
            and fl.get("extproc_us_per_chunk")
            and (fd["extproc_us_per_chunk"] < fl["extproc_us_per_chunk"])
        ):
            out.append(
                f"- **Streaming**: a response chunk costs the EPP {f(fd['extproc_us_per_chunk'], 0)} µs "
                f"with a body plugin, the grpc.aio no-op floor {f(fl['extproc_us_per_chunk'], 0)} µs: "
                "most of a chunk's cost is the message round trip (frame parsing, protobuf, the reply "
                "and its write), not the EPP's chunk handling. With Envoy's buffered/streamed "
                f"modes and nothing needing bodies, the EPP received "
                f"{f(skip.get('extproc_msgs_per_event'), 3)} messages per streamed event."
            )
        elif fd.get("extproc_us_per_chunk") and fl.get("extproc_us_per_chunk"):
            out.append(
                f"- **Streaming**: a response chunk costs the EPP {f(fd['extproc_us_per_chunk'], 0)} µs "
                "with a "
                f"body plugin and the no-op floor {f(fl['extproc_us_per_chunk'], 0)} µs: the per-message "
                "transport, not the EPP's chunk handling, sets the rate. With Envoy's buffered/streamed "
                "modes "
                f"and nothing needing bodies, the EPP received {f(skip.get('extproc_msgs_per_event'), 3)} "
                "messages per streamed event."
            )
    lp = res.get("long_prompts")
    if lp:
        d = lp["derived"]
        at400 = d["added"].get("epp", {}).get("400", {}).get("p50_ms_over_floor")
        out.append(
            f"- **Long prompts**: the EPP adds {f(at400, 2)} ms p50 over the floor at 400 KB; at 220 KB and "
            f"concurrency 20 the EPP path adds {f(d.get('epp_added_mean_ms_220kb_c20_over_direct'), 1)} ms "
            "mean over "
            f"direct (GIE reported {f(d.get('go_epp_added_mean_ttft_ms_220kb_c20'), 0)} ms for the Go EPP "
            "path)."
        )
    out += suggestions(res)
    if out:
        out = ["## Findings", "", *out, ""]
    return out


def suggestions(res: dict[str, dict[str, Any] | None]) -> list[str]:
    """What the measured split of costs points at, for whoever optimises next."""
    out: list[str] = []
    o, s, r = res.get("overhead"), res.get("streaming"), res.get("routing")
    cap = (o or {}).get("capacity", {})
    epp = (cap.get("epp", {}).get("cpu_us_per_req") or {}).get("extproc")
    floor = (cap.get("floor", {}).get("cpu_us_per_req") or {}).get("extproc")
    if epp and floor and floor >= epp:
        out.append(
            "- *Suggests*: with the transport no longer dominant, the remaining cost per request is "
            "spread thin (profile above): write syscalls, protobuf access to Envoy's header maps "
            "(`headers_to_dict`), the prefix index, the director. Fewer writes per request (Envoy "
            "answers each message separately) and decoding header maps from the wire bytes are the "
            "next factors; beyond one core, several EPP processes behind one Service."
        )
    elif epp and floor and floor / epp >= 0.5:
        out.append(
            f"- *Suggests*: the ext_proc transport is {floor / epp:.0%} of the EPP's cost per request, so "
            "the "
            "next factor comes from fewer or cheaper messages (skip phases no plugin needs, a cheaper "
            "gRPC stack: grpclib + uvloop was 21% cheaper in overhead-baseline.md, or several EPP "
            "processes), not from the scheduler."
        )
    chunk = ((s or {}).get("per_chunk", {}).get("epp-fd", {}) or {}).get("extproc_us_per_chunk")
    cells = [c for c in (r or {}).get("cells", []) if "failed" not in c and c["router"] == "epp-default"]
    if chunk and cells:
        c = max(cells, key=lambda c: c["rate"])
        cpu = (c.get("router_cpu_s") or {}).get("epp")
        tokens = r["workload"]["output_tokens"] if r else 0
        if cpu and c.get("ok") and tokens:
            per_req_ms = cpu / c["ok"] * 1e3
            chunks_ms = chunk * tokens / 1e3
            out.append(
                f"- *Suggests*: at ~{f(chunk, 0)} µs per response chunk, {tokens} streamed tokens cost the "
                "EPP "
                f"~{chunks_ms:.1f} ms of the {per_req_ms:.1f} ms it spends per routed request under GIE's "
                "full-duplex "
                "config; Envoy's buffered/streamed modes with mode override remove that cost when no plugin "
                "needs response bodies."
            )
    return out


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


SECTIONS: tuple[tuple[str, Callable[[dict[str, Any]], list[str]]], ...] = (
    ("routing", routing_section),
    ("overhead", overhead_section),
    ("long_prompts", long_prompts_section),
    ("streaming", streaming_section),
)
MICRO = ("scheduler", "scrape", "parsers", "flowcontrol", "sim_cost")


def build() -> Path:
    res: dict[str, dict[str, Any] | None] = {n: read_result(n) for n, _ in SECTIONS}
    res.update({n: read_result(n) for n in MICRO})
    run = read_result("run")
    lines = header(res, run)
    for name, fn in SECTIONS:
        data = res.get(name)
        if data is None:
            lines += [f"## {name}", "", f"*No results (bench/results/{name}.json missing).*", ""]
            continue
        try:
            lines += fn(data)
        except (KeyError, TypeError, ValueError) as e:
            lines += [f"## {name}", "", f"*Could not render bench/results/{name}.json: {e!r}.*", ""]
    try:
        lines += micro_section(res)
    except (KeyError, TypeError, ValueError) as e:
        lines += ["## 5. Micro-benchmarks", "", f"*Could not render: {e!r}.*", ""]
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    return REPORT


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0]).parse_args(
        argv
    )
    path = build()
    log(f"report: wrote {path} and {PLOTS}/*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
