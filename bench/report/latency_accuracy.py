"""Section: the latency predictor's TTFT accuracy per load level (bench/results/latency*.json)."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.

from __future__ import annotations

import json
from typing import Any

from bench.common import RESULTS
from bench.report.fmt import f, table

GOAL_PCT = 20.0


def accuracy_runs() -> list[tuple[str, dict[str, Any]]]:
    """Result files with accuracy runs per router (``bench.latency --accuracy-routers``), oldest first."""
    found = []
    for path in sorted(RESULTS.glob("latency*.json")):
        data = json.loads(path.read_text())
        runs = data.get("accuracy") or []
        if runs and all("router" in r for r in runs):
            found.append((data.get("finished", ""), path.stem, data))
    found.sort(key=lambda t: t[0])
    return [(name, data) for _, name, data in found]


def latency_accuracy_section() -> list[str]:
    found = accuracy_runs()
    if not found:
        return []
    rates = found[-1][1]["accuracy"][0]["levels"]
    out = [
        "## Latency predictor: TTFT accuracy",
        "",
        "`python -m bench.latency --no-goodput --accuracy-routers predictor,predictor-gie-least`: "
        "4 simulated replicas in real time, Poisson arrivals rising level by level on one EPP (the model "
        "keeps "
        "learning), the median model (`EPP_LATENCY_QUANTILE=0.5`). TTFT MdAPE per level after its first "
        "quarter, against the TTFT the client measured, with the median signed error in brackets. "
        f"Goal: ≤ {GOAL_PCT:g} % at every level. `predictor` is config/examples/predicted-latency.yaml "
        "(`most`: spreads load), `predictor-gie-least` GIE's default strategy (packs load up to the SLO: "
        "the most queueing). Details: [docs/latency-prediction.md](../docs/latency-prediction.md).",
        "",
    ]
    headers = (
        ["result", "router", "learner"] + [f"{lv['rate_rps']:g}/s" for lv in rates] + ["worst", "status"]
    )
    rows = []
    for name, data in found:
        for run in data["accuracy"]:
            levels = run["levels"]
            cells = [
                f"{f(lv['ttft_mdape_pct'])} % ({f(lv['ttft_median_signed_pct_error'])})" for lv in levels
            ]
            worst = max(lv["ttft_mdape_pct"] for lv in levels)
            status = "**met**" if worst <= GOAL_PCT else "not met"
            rows.append([name, run["router"], str(run["learner"]), *cells, f"{f(worst)} %", status])
    out += [table(headers, rows), ""]
    last = found[-1][1]
    at100 = next((c for c in last.get("prediction", []) if c["endpoints"] == 100), None)
    tr = last.get("training")
    if at100 and tr:
        out += [
            f"Cost in that run ({found[-1][0]}): the model product for 100 candidates p50 "
            f"{f(at100['predict_us']['p50'])} µs (goal ≤ 50 µs), the whole PrepareData "
            f"{f(at100['prepare_data_us']['p50'])} µs; one training on full rings "
            f"{f(tr['train_cpu_ms_p50'], 2)} ms CPU, {f(tr['cpu_share_of_one_core_pct'], 2)} % of one core "
            "at 100 req/s (goal ≤ 5 %).",
            "",
        ]
    return out
