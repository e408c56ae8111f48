"""Section 1: routing quality (TTFT, throughput and cache hits per router), and its plot."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, profile_section, pyplot, ratio, save_plot, table


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
    plt = pyplot()
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
    return save_plot(fig, "routing.png")
