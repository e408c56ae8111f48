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
_ROUNDS_TO_ZERO = 0.005  # a margin printed as 0% is not called a loss
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
        "link shared by concurrent transfers), and, for the prefix-based decider, also a symmetric "
        f"fleet of {pd['pods']} `prefill-decode` pods, each behind the proxy (a declined request is "
        "served whole by any pod; a disaggregated one is prefilled on another pod, "
        "`exclude-peer-filter`). `declinedProfile` (ours) serves a request the decider declined whole "
        "on any of the 2 + 2 pods, prefill pods included; `dedicatedDecodeOnly` (ours) disaggregates "
        "only for a decode pick that takes no prefill work, i.e. never on the symmetric fleet. "
        "Envoy + EPP in every mode; open-loop Poisson arrivals "
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
    out += _noise(pd)
    out += _verdicts(pd)
    return out


def _noise(pd: dict[str, Any]) -> list[str]:
    """The repeated cells: how far a second run of the same cell moved each metric."""
    rows = []
    for r in pd.get("repeats", []):
        n = r.get("noise")
        if n is None:
            continue
        title = pd["modes"].get(r["mode"], r["mode"])
        rows.append(
            [
                f"{r['workload']}: {title}",
                *[f(None if n.get(k) is None else n[k] * 100, 1) for k, _ in _COLUMNS],
            ]
        )
    if not rows:
        return []
    return [
        "Noise: the same cell run twice (same prompts and arrival times), |second / first − 1| in %:",
        "",
        table(["cell", *[t for _, t in _COLUMNS]], rows),
        "",
    ]


def _verdicts(pd: dict[str, Any]) -> list[str]:
    """Per prefix-based mode and workload: its margin over the worse of aggregated and
    always-disaggregate on every metric (positive: worse than both)."""
    derived = pd["derived"]
    tol = derived["tolerance"]
    verdicts = derived.get("verdicts", {})
    out = []
    for mode, wls in verdicts.items():
        title = pd["modes"].get(mode, mode)
        rows = []
        for wl, v in wls.items():
            cells = []
            for k, _ in _COLUMNS:
                m = v["margins"].get(k)
                text = "–" if m is None else f"{m * 100:+.0f}%".replace("-", "−")
                text = "0%" if text in ("+0%", "−0%") else text
                cells.append(f"**{text}**" if m is not None and m > tol else text)
            worst = v.get("worst_margin")
            if worst is None or worst < _ROUNDS_TO_ZERO:
                ok = "yes"
            elif v["never_worse_than_both"]:  # worse than both, but within the tolerance: still said
                ok = f"no, by {worst:.0%} (within {tol:.0%})"
            else:
                ok = "**no**"
            rows.append([wl, ok, *cells])
        out += [
            f"**{title}** against the worse of aggregated and always-disaggregate, per metric "
            f"(positive = worse than both; bold beyond the {tol:.0%} tolerance):",
            "",
            table(["workload", "never worse than both", *[t for _, t in _COLUMNS]], rows),
            "",
        ]
    said = []
    for mode, wls in verdicts.items():
        bad = [(wl, v) for wl, v in wls.items() if (v.get("worst_margin") or 0) >= _ROUNDS_TO_ZERO]
        where = ", ".join(f"{wl} ({v['worst_metric']} +{v['worst_margin']:.0%})" for wl, v in bad)
        said.append(
            f"{pd['modes'].get(mode, mode)}: "
            + (f"worse than both on {where}" if bad else "never worse than both on any workload")
        )
    if said:
        out += ["Overall — " + "; ".join(said) + ".", ""]
    return out
