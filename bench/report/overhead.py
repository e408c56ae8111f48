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
