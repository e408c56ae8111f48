"""Section 2: the overhead of the routing hop (latency ladder, capacity, CPU, profile), and its plot."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, profile_section, pyplot, quotient, ratio, save_plot, table


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
    own_floor = (
        "floor-h2" in o["ladder"]
    )  # the no-op server on the EPP's own transport (older results lack it)
    if own_floor:
        out += [
            'Two floors: the no-op ext_proc server on grpc.aio ("floor", what a Python ext_proc server '
            "costs written the obvious way) and the same server on the EPP's own HTTP/2 transport "
            '("own floor", src/epp/server/h2): over the own floor, the EPP\'s cost is its routing work.',
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
                    *([f(a.get("p50_ms_over_own_floor"), 2)] if own_floor else []),
                    f(cpu.get("total"), 0),
                    f(cpu.get("envoy"), 0),
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
                *(["p50 over own floor"] if own_floor else []),
                "CPU µs/req (all)",
                "Envoy µs/req",
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
    own = cap.get("floor-h2", {})
    rows = []
    for name, title in paths.items():
        c = cap.get(name)
        if not c:
            continue
        cpu = c["cpu_us_per_req"]
        proc = cpu.get("extproc") or cpu.get("router")
        rows.append(
            [
                title,
                f(c["achieved_rps"], 0),
                ratio(quotient(c["achieved_rps"], env.get("achieved_rps"))),
                ratio(quotient(c["achieved_rps"], floor.get("achieved_rps"))),
                *([ratio(quotient(c["achieved_rps"], own.get("achieved_rps")))] if own_floor else []),
                f(cpu.get("total"), 0),
                f(cpu.get("envoy"), 0),
                f(proc, 0),
                f(1e6 / proc, 0) if proc else "–",
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
                *(["vs own floor"] if own_floor else []),
                "CPU µs/req (all)",
                "Envoy µs/req",
                "CPU µs/req (ext_proc or router)",
                "req/s per core of that process",
                "max sustained open-loop rate",
            ],
            rows,
        ),
        "",
    ]
    out += hop_section(o)
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


def plot_overhead(o: dict[str, Any]) -> str:
    plt = pyplot()
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
    return save_plot(fig, "overhead.png")


def hop_section(o: dict[str, Any]) -> list[str]:
    """The whole hop by process against its fair floor (issue 31), and what lean.yaml saves Envoy."""
    hop = o["derived"].get("hop") or {}
    if not hop.get("paths"):
        return []
    paths = o["paths"]
    rows = []
    for name, h in hop["paths"].items():
        cpu, fl = h["cpu_us_per_req"], h["floor_cpu_us_per_req"]
        rows.append(
            [
                paths.get(name, name),
                paths.get(h["floor"], h["floor"]),
                f(h["achieved_rps"], 0),
                ratio(h["capacity_ratio"]),
                f(cpu.get("envoy"), 0),
                f(cpu.get("extproc"), 0),
                f(cpu.get("total"), 0),
                f(fl.get("envoy"), 0),
                f(fl.get("extproc"), 0),
                f(fl.get("total"), 0),
                ratio(h["cpu_ratio"]),
                ratio(h["cpu_ratio_vs_gie_floor"]),
                f(h["added_p50_ms"], 2),
            ]
        )
    out = [
        "### The whole hop against its fair floor, by process",
        "",
        "Each EPP path over the no-op ext_proc path under the same Envoy config, asking Envoy for the "
        "same phases (GIE's FULL_DUPLEX_STREAMED config, or deploy/envoy/lean.yaml, where the EPP skips "
        "the response phases no plugin reads). At capacity, median over rounds; ratios are taken within "
        f"a round. Added p50 at {hop['rate']} req/s over the same floor: the median over rounds of "
        "the difference within a round, the paths' windows cut into slices taken in turn.",
        "",
        table(
            [
                "path",
                "fair floor",
                "req/s",
                "vs floor",
                "Envoy µs/req",
                "EPP µs/req",
                "total µs/req",
                "floor Envoy",
                "floor ext_proc",
                "floor total",
                "CPU vs floor",
                "CPU vs GIE floor-h2",
                f"added p50 ms @{hop['rate']}",
            ],
            rows,
        ),
        "",
    ]
    saves = hop.get("lean_saves") or {}
    if saves:
        out += [
            "What the lean Envoy config saves per EPP config (Envoy's CPU per request at capacity, "
            "GIE's config against lean.yaml):",
            "",
            table(
                [
                    "EPP config",
                    "Envoy µs/req GIE",
                    "Envoy µs/req lean",
                    "Envoy share saved",
                    "whole hop saved",
                ],
                [
                    [
                        config,
                        f(v["envoy_us_per_req"]["gie"], 0),
                        f(v["envoy_us_per_req"]["lean"], 0),
                        _pct(v["envoy_share_saved"]),
                        _pct(v["total_share_saved"]),
                    ]
                    for config, v in saves.items()
                ],
            ),
            "",
        ]
    out += ["Goals (issue 31):", ""]
    for g in hop.get("goals", []):
        op = "≥" if g["goal"] == "capacity_ratio" else "≤"
        unit = " ms" if g["goal"] == "added_p50_ms" else "×"
        value = "–" if g["value"] is None else f"{g['value']:.2f}{unit}"
        out.append(
            f"- {'PASS' if g['met'] else 'FAIL'}: {paths.get(g['path'], g['path'])} {g['goal']} "
            f"{value} {op} {g['limit']:g}{unit} (over {g['floor']})"
        )
    out.append("")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
