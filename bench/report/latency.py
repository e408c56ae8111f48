"""Section: the in-process latency predictor (bench/latency.py): cost, accuracy, goodput per router."""

# The report is typeset markdown: the multiplication sign is meant.

from __future__ import annotations

from typing import Any

from bench.common import read_result
from bench.report.fmt import f, ratio, table
from bench.report.latency_accuracy import accuracy_runs

GOODPUT_RESULT = "latency-goodput"  # the full goodput run (docs/latency-prediction.md#goodput)
COST_RESULT = "latency-cost"  # a cost-only run (bench.latency --no-accuracy --no-goodput --result-name ...)
REPEAT_RESULT = "latency-goodput-run2"  # the same ladder again, with the peer routers
STEADY_RESULT = "latency-goodput-steady"  # one rate held for minutes: is the best-effort backlog bounded?

_LABELS = {
    "default": "EPP, default config",
    "predictor": "EPP, predictor (our example)",
    "predictor-gie-least": "EPP, GIE's predictor config",
    "predictor-max-score": "EPP, predictor + max-score picker",
    "predictor-mixed-slo": "EPP, predictor + SLO reserve (mixed-slo)",
    "predictor-mixed-slo-pack": "EPP, predictor + best-effort packing",
    "round-robin": "Envoy round robin",
    "sglang-cache-aware": "sglang-router cache_aware",
    "vllm-cache-aware": "vllm-router cache_aware",
}


def latency_section(doc: dict[str, Any]) -> list[str]:
    st = doc["settings"]
    out = ["## Predicted-latency routing", ""]
    src = doc
    alone = read_result(COST_RESULT)
    if alone is not None and alone.get("prediction") and alone.get("finished", "") > doc.get("finished", ""):
        src = alone
        out += [f"Cost from bench/results/{COST_RESULT}.json (`{alone.get('command', '')}`).", ""]
    cost = {c["endpoints"]: c for c in src.get("prediction", [])}
    if cost:
        out += [
            "Prediction cost (p50, in process): "
            + ", ".join(
                f"{n} endpoints {f(c['predict_us']['p50'])} µs "
                f"(PrepareData {f(c['prepare_data_us']['p50'])} µs"
                + (
                    f", {f(c['prepare_over_product'])} model products; with traffic "
                    f"{f(c['prepare_data_traffic_us']['p50'])} µs"
                    if "prepare_data_traffic_us" in c
                    else ""
                )
                + ")"
                for n, c in sorted(cost.items())
            )
            + f"; training {f(src['training']['cpu_share_of_one_core_pct'], 2)} % of a core at "
            f"{f(src['training']['rate_rps'], 0)} req/s.",
            "",
        ]
    newer = [name for name, run in accuracy_runs() if run.get("finished", "") > doc.get("finished", "")]
    if newer:
        # the per-router accuracy runs (their own section) supersede this file's own, older table
        out += [
            f"TTFT accuracy: see *Latency predictor: TTFT accuracy* below ({', '.join(newer)}, newer than "
            f"bench/results/latency.json's own run, `{doc.get('command', '')}`).",
            "",
        ]
    for acc in [] if newer else doc.get("accuracy", []):
        rows = [[f(lv["rate_rps"], 0), f(lv["ttft_mdape_pct"]), f(lv["ttft_median_signed_pct_error"])]
                for lv in acc["levels"]]  # fmt: skip
        out += [f"TTFT accuracy, learner {acc['learner']} (MdAPE %, median signed error %):", "",
                table(["req/s", "MdAPE", "signed"], rows), ""]  # fmt: skip
    full = read_result(GOODPUT_RESULT)
    if full is not None and full.get("goodput"):
        doc, st = full, full["settings"]
        out += [f"Goodput from bench/results/{GOODPUT_RESULT}.json (`{full.get('command', '')}`).", ""]
    goodput = doc.get("goodput")
    if not goodput:
        return out
    runs = doc["goodput_runs"]
    out += [
        f"Goodput: {st.get('judging', '')}; the mixed chat / document workload of "
        "docs/latency-prediction.md#goodput, half the requests (the chat turns) with a "
        f"{f(st['slo_ttft_ms'], 0)} ms TTFT SLO, {f(st['goodput_seconds_per_level'], 0)} s per rate, "
        "every router on a fresh fleet with the same arrivals. Cells: SLO met (of the SLO requests), "
        "chat TTFT p90, document TTFT p90 (ms), completed requests, output tokens.",
        "",
    ]
    rows = []
    for g in goodput:
        for name in runs:
            c = g[name]
            rows.append([
                f(g["rate_rps"], 0), _LABELS.get(name, name),
                f"{c.get('slo_met')}/{g['slo_requests']} ({f(c.get('slo_met_pct'))} %)",
                ratio(c.get("goodput_ratio_vs_default")), f(c.get("chat_ttft_p90_ms"), 0),
                f(c.get("doc_ttft_p90_ms"), 0), f"{c.get('ok')}/{c.get('requests')}",
                f(c.get("output_tokens"), 0),
                f(c.get("window_completed_rps"), 1), f(c.get("window_output_tokens_per_s"), 0),
            ])  # fmt: skip
    out += [table(["req/s", "router", "SLO met", "vs default", "chat p90", "doc p90", "completed",
                   "output tok", "done/s in window", "tok/s in window"], rows), ""]  # fmt: skip
    rows = [[_LABELS.get(n, n), f"{r['run']['ok']}/{r['run']['requests']}", f(r["run"]["output_tokens"], 0),
             f(r["run"]["makespan_s"], 1), f(r["run"]["output_tokens_per_s"], 0)]
            for n, r in runs.items() if "run" in r]  # fmt: skip
    if rows:
        out += ["Whole run (warm-up included): completed, output tokens, first send to last completion (s), "
                "output tokens/s over it:", "",
                table(["router", "completed", "output tok", "makespan", "tok/s"], rows), ""]  # fmt: skip
    for name, goal in doc.get("goals", {}).items():
        out.append(f"- goal `{name}`: {goal}")
    return [*out, "", *_repeat(), *_steady()]


def _repeat() -> list[str]:
    """The second run of the ladder: SLO met and in-window throughput against the default config."""
    doc = read_result(REPEAT_RESULT)
    if doc is None or not doc.get("goodput"):
        return []
    rows = []
    for g in doc["goodput"]:
        for name in doc["goodput_runs"]:
            c = g[name]
            rows.append([
                f(g["rate_rps"], 0), _LABELS.get(name, name),
                f"{c.get('slo_met')}/{g['slo_requests']} ({f(c.get('slo_met_pct'))} %)",
                ratio(c.get("goodput_ratio_vs_default")),
                f(c.get("window_completed_rps"), 1), ratio(c.get("window_completed_ratio_vs_default")),
                f(c.get("window_output_tokens_per_s"), 0), ratio(c.get("window_tokens_ratio_vs_default")),
            ])  # fmt: skip
    goals = [
        f"- goal `{k}`: {v}" for k, v in doc.get("goals", {}).items() if k.startswith(("goodput", "window"))
    ]
    return [
        f"Goodput, run 2, bench/results/{REPEAT_RESULT}.json (`{doc.get('command', '')}`): SLO met, "
        "and requests and output tokens per second finished while the rate was offered, each "
        "against the default config's.",
        "",
        table(
            ["req/s", "router", "SLO met", "vs default", "done/s", "vs default", "tok/s", "vs default"], rows
        ),
        "",
        *goals,
        "",
    ]


def _steady() -> list[str]:
    """The steady-load run: one row per window of the held rate, per router."""
    doc = read_result(STEADY_RESULT)
    if doc is None or not doc.get("goodput_runs"):
        return []
    st = doc["settings"]
    rows = []
    for name, run in doc["goodput_runs"].items():
        for i, lv in enumerate(run["levels"]):
            rows.append([
                _LABELS.get(name, name), f(st["goodput_seconds_per_level"] * (i + 1), 0),
                f"{f(lv.get('slo_met_pct'))} %",
                f(lv.get("chat_ttft_p90_ms"), 0), f(lv.get("doc_ttft_p90_ms"), 0),
                f(lv.get("window_completed_rps"), 1), f(lv.get("window_output_tokens_per_s"), 0),
                f"{lv.get('in_flight_at_end')} ({lv.get('in_flight_at_end_max_replica')})",
                str(lv.get("docs_waiting_at_end")),
            ])  # fmt: skip
    for name, run in doc["goodput_runs"].items():
        lvs = run["levels"]
        met, of = sum(lv["slo_met"] for lv in lvs), sum(lv["slo_requests"] for lv in lvs)
        rows.append([
            f"**{_LABELS.get(name, name)}**", "all", f"{met}/{of} ({f(100 * met / of)} %)", "", "",
            f(sum(lv["window_completed_rps"] for lv in lvs) / len(lvs), 2),
            f(sum(lv["window_output_tokens_per_s"] for lv in lvs) / len(lvs), 0), "", "",
        ])  # fmt: skip
    return [
        f"Steady load, bench/results/{STEADY_RESULT}.json (`{doc.get('command', '')}`): one rate held, "
        "in windows of the held rate; SLO met, chat and document TTFT p90 (ms) of the window's "
        "requests, requests and output tokens finished in the window, requests in flight at its end "
        "(on the busiest replica) and documents still without a first token.",
        "",
        table(
            ["router", "s", "SLO met", "chat p90", "doc p90", "done/s", "tok/s", "in flight", "docs waiting"],
            rows,
        ),
        "",
    ]
