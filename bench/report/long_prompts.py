"""Section 3: long prompts (latency added by prompt size), and its plot."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.

from __future__ import annotations

from typing import Any

from bench.report.fmt import difference, f, pyplot, save_plot, table


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
            f(difference(c.get("mean_ms"), d.get("mean_ms")), 1),
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


def plot_long(lp: dict[str, Any]) -> str:
    plt = pyplot()
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
    return save_plot(fig, "long_prompts.png")
