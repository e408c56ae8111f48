"""Section: P/D disaggregation against aggregated serving (bench/pd.py), wins and losses alike."""

# The report is typeset markdown: the multiplication sign and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, table

_COLUMNS = (
    ("ttft_mean_ms", "TTFT mean"),
    ("ttft_p90_ms", "TTFT p90"),
    ("itl_mean_ms", "ITL mean"),
    ("itl_p90_ms", "ITL p90"),
    ("e2e_mean_ms", "E2E mean"),
    ("e2e_p90_ms", "E2E p90"),
    ("output_tokens_per_s", "output tok/s"),
)
_LOWER_IS_BETTER = {k for k, _ in _COLUMNS if k != "output_tokens_per_s"}


def _verdict(key: str, r: float | None) -> str:
    """A ratio to aggregated with its sign spelled out: wins in bold, losses in italics."""
    if r is None:
        return "–"
    better = r < 1 if key in _LOWER_IS_BETTER else r > 1
    change = f"{(r - 1) * 100:+.0f}%".replace("-", "−")
    if abs(r - 1) < 0.03:
        return f"{r:.2f}× (≈)"
    return f"**{r:.2f}× ({change}, better)**" if better else f"*{r:.2f}× ({change}, worse)*"


def pd_section(pd: dict[str, Any]) -> list[str]:
    st = pd["settings"]
    derived = pd["derived"]
    out = [
        "## P/D disaggregation",
        "",
        f"{pd['pods']} simulated pods either way: aggregated (every pod prefills and decodes, the "
        f"EPP's default config) against {pd['prefill_pods']} prefill + "
        f"{pd['pods'] - pd['prefill_pods']} decode pods, each decode pod behind the project's decode "
        "proxy (llm-d's sidecar protocol; the KV transfer is modelled at ~10× prefill speed over a "
        "link shared by concurrent transfers). Envoy + EPP in every mode; open-loop Poisson arrivals "
        f"for {st['duration_s']:g} s per cell. {pd.get('note', '')}.",
        "",
    ]
    cells = {(c["workload"], c["mode"]): c for c in pd["cells"]}
    for wl in st["workloads"]:
        out += [
            f"**{wl['title']}**, {wl['rate']:g} req/s",
            "",
        ]
        rows = []
        for mode, title in pd["modes"].items():
            c = cells.get((wl["name"], mode))
            if c is None:
                continue
            if "failed" in c:
                rows.append([title, "failed: " + c["failed"][:80], *["" for _ in _COLUMNS[1:]], ""])
                continue
            rows.append([title, *[f(c.get(k), 1) for k, _ in _COLUMNS], f"{c['ok']}/{c['requests']}"])
        out += [table(["mode", *[t for _, t in _COLUMNS], "ok"], rows), ""]
        ratios = derived["ratios_to_aggregated"].get(wl["name"], {})
        rows = [
            [pd["modes"][mode], *[_verdict(k, r.get(k)) for k, _ in _COLUMNS]]
            for mode, r in ratios.items()
            if mode != "aggregated"
        ]
        out += [
            "Ratio to aggregated (lower is better except tok/s):",
            "",
            table(["mode", *[t for _, t in _COLUMNS]], rows),
            "",
        ]
    worse = derived["prefix_worse_than_both"]
    tol = derived["tolerance"]
    if worse:
        items = "; ".join(
            (f"**{w['workload']} {w['metric']} +{w['margin']:.0%}**" if w["margin"] > tol else
             f"{w['workload']} {w['metric']} +{w['margin']:.0%}")
            for w in worse
        )  # fmt: skip
        beyond = sum(1 for w in worse if w["margin"] > tol)
        out += [
            f"Where the prefix-based decider is worse than both other modes (margin over the worse of the "
            f"two; in bold the {beyond} beyond the {tol:.0%} run-to-run tolerance): {items}.",
            "",
        ]
    else:
        out += [
            "The prefix-based decider is never worse than both other modes on any workload and metric.",
            "",
        ]
    return out
