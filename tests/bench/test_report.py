"""bench/REPORT.md is rebuilt from result files alone, with goals, tables and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bench.common
import bench.report
import bench.report.fmt
from bench.overhead import derive as overhead_derive
from bench.routing import derive as routing_derive

MACHINE = {"cores": 2, "cpu_model": "test cpu", "kernel": "6.0", "memory_gib": 1.0, "loadavg_at_start": [0.0]}


def _routing() -> dict[str, Any]:
    cells = []
    for router, p90, tput in (("epp-default", 80.0, 2100.0), ("round-robin", 1000.0, 1000.0)):
        cells.append({
            "router": router, "rate": 16.0, "ttft_ms": {"p50": p90 / 2, "p90": p90, "p99": p90 * 2},
            "itl_ms": {"p50": 10.0}, "output_tokens_per_s": tput, "success_rate": 1.0, "ok": 10, "requests": 10,
            "fleet": {"prefix_hit_rate": 0.5, "load_imbalance_max_over_mean": 1.1},
        })  # fmt: skip
    routers = {"epp-default": "Envoy + EPP", "round-robin": "Envoy round robin"}
    return {
        "machine": MACHINE, "seeds": {"workload": 42}, "notes": ["a note"], "routers": routers, "cells": cells,
        "settings": {"duration_s": 10, "loadgen": "builtin"},
        "workload": {"replicas": 8, "time_scale": 1.0, "groups": 4, "system_tokens": 100, "question_tokens": 10,
                     "output_tokens": 4, "kv_blocks": 10, "block_size": 16, "working_set_tokens": 400,
                     "working_set_over_fleet_kv": 1.1, "working_set_over_replica_kv": 9.0},
        "derived": routing_derive(cells, list(routers)),
    }  # fmt: skip


def _overhead(own_floor: bool = False) -> dict[str, Any]:
    def cell(p50: float, cpu: float) -> dict[str, Any]:
        return {"p50_ms": p50, "p99_ms": p50 * 3, "ok": 100, "offered": 100, "sustained": True,
                "cpu_us_per_req": {"total": cpu, "extproc": cpu / 2}, "achieved_rps": 100.0}  # fmt: skip

    paths = {"direct": "(a)", "envoy": "(b)", "floor": "(c)", "epp": "(d)"}
    if own_floor:
        paths = {"direct": "(a)", "envoy": "(b)", "floor": "(c)", "floor-h2": "(c')", "epp": "(d)"}
    result = {
        "machine": MACHINE, "paths": paths, "notes": [],
        "settings": {"upstreams": 4, "request_bytes": 1000, "window_s": 1, "rounds": 1, "concurrency": 32,
                     "capacity_s": 1, "sustain_rule": "rule"},
        "ladder": {name: {"100": cell(0.2 * (i + 1), 100.0 * i)} for i, name in enumerate(paths)},
        "capacity": {name: cell(1.0, 500.0) for name in paths},
        "max_sustained_rps": dict.fromkeys(paths, 100),
    }  # fmt: skip
    result["derived"] = overhead_derive(result)
    return result


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench.report.fmt, "PLOTS", tmp_path / "plots")
    monkeypatch.setattr(bench.report, "REPORT", tmp_path / "REPORT.md")
    (tmp_path / "results").mkdir()
    return tmp_path


def test_report_from_results(results_dir: Path) -> None:
    """Goals with ratios, each section's table and plot, and a placeholder for missing results."""
    (results_dir / "results" / "routing.json").write_text(json.dumps(_routing()))
    (results_dir / "results" / "overhead.json").write_text(json.dumps(_overhead()))
    text = bench.report.build().read_text()
    times = "\u00d7"  # the report prints a multiplication sign
    assert (
        f"| 1 routing (Envoy + EPP, 16 req/s) | TTFT p90 ≤ 0.1{times} round robin | 0.08{times} | **met** |"
        in text
    )
    assert (
        "| 2 overhead | EPP adds ≤ 0.3 ms p50 over the no-op ext_proc floor (at 100 req/s, the lowest rate both "
        "sustain) | 0.20 ms | **met** |" in text
    )
    assert "## 1. Routing quality" in text
    assert "## 2. Overhead of the routing hop" in text
    assert "*No results (bench/results/streaming.json missing).*" in text
    assert (results_dir / "plots" / "routing.png").stat().st_size > 1000
    assert (results_dir / "plots" / "overhead.png").stat().st_size > 1000


def test_report_shows_both_floors(results_dir: Path) -> None:
    """With the no-op server on the EPP's own transport measured, its goal, columns and finding appear;
    results without it (older runs) render as before (test above)."""
    o = _overhead(own_floor=True)
    assert o["derived"]["epp_added_p50_ms_over_own_floor"] == pytest.approx(0.2)  # epp 1.0 - floor-h2 0.8
    assert o["derived"]["epp_added_p50_ms_over_floor"] == pytest.approx(0.4)  # epp 1.0 - floor 0.6
    (results_dir / "results" / "overhead.json").write_text(json.dumps(o))
    text = bench.report.build().read_text()
    assert (
        "| 2 overhead | EPP adds ≤ 0.3 ms p50 over the no-op floor on its own h2 transport (at 100 req/s, the "
        "lowest rate both sustain) | 0.20 ms | **met** |" in text
    )
    assert "| p50 over floor | p50 over own floor |" in text
    assert "| vs floor | vs own floor |" in text
    assert "- **Routing cost over the own floor**" in text


def test_report_latency_goodput_table(results_dir: Path) -> None:
    """Every router's cell per rate, its ratio to the default config, throughput, and the goal line."""
    from bench.latency import goodput_summary

    def level(rate: float, met: int) -> dict[str, Any]:
        return {"rate_rps": rate, "slo_met": met, "slo_requests": 100, "slo_met_pct": float(met),
                "chat_ttft_p90_ms": 300.0, "doc_ttft_p90_ms": 900.0, "ok": 200, "requests": 200,
                "output_tokens": 5000, "window_completed_rps": 9.5, "window_output_tokens_per_s": 2400.0}  # fmt: skip

    run = {
        "ok": 400,
        "requests": 400,
        "output_tokens": 10000,
        "makespan_s": 60.0,
        "output_tokens_per_s": 166.7,
    }
    runs = {
        "default": {"levels": [level(9.0, 70)], "run": run},
        "predictor-mixed-slo": {"levels": [level(9.0, 91)], "run": run},
        "sglang-cache-aware": {"levels": [level(9.0, 60)], "run": run},
    }
    doc = {
        "machine": MACHINE, "settings": {"slo_ttft_ms": 400.0, "goodput_seconds_per_level": 25.0, "judging": "j"},
        "goodput_runs": runs, "goodput": goodput_summary(runs),
        "goals": {"goodput_ratio_at_judging_rate": {"goal": 1.3, "value": 1.3, "met": True}},
    }  # fmt: skip
    (results_dir / "results" / "latency.json").write_text(json.dumps(doc))
    text = bench.report.build().read_text()
    times = "\u00d7"
    assert "## Predicted-latency routing" in text
    assert f"| 9 | EPP, predictor + SLO reserve (mixed-slo) | 91/100 (91.0 %) | 1.30{times} |" in text
    assert f"| 9 | sglang-router cache_aware | 60/100 (60.0 %) | 0.86{times} |" in text
    assert "goodput_ratio_at_judging_rate" in text


def test_precise_below_its_fallback_is_flagged_from_a_point_not_on_rounding() -> None:
    """A shortfall of a full point of hit rate gets a line; 66.8% vs 67.0% ("67% vs 67%") does not."""
    from bench.report.prefix_routing import _precise_vs_fallback

    def cell(router: str, rate: float, hits: float) -> dict[str, Any]:
        return {"router": router, "rate": rate, "fleet": {"prefix_hit_rate": hits}, "ttft_ms": {"p90": 100.0}}

    cells = [
        cell("epp-precise", 16.0, 0.668),
        cell("epp-approx", 16.0, 0.670),
        cell("epp-precise", 32.0, 0.40),
        cell("epp-approx", 32.0, 0.42),
        cell("epp-precise-no-events", 32.0, 0.405),
    ]
    lines = [x for x in _precise_vs_fallback({"cells": cells}) if x]
    assert len(lines) == 1
    assert lines[0].startswith("At 32 req/s the precise scorer hit the cache less than the approximate index")


def test_a_repeated_cell_says_it_is_a_median_and_how_far_its_runs_spread() -> None:
    from bench.report.prefix_routing import _runs

    runs = [{"ttft_p90_ms": 3991.0}, {"ttft_p90_ms": 3024.0}, {"failed": True}]
    assert _runs({"runs": runs}) == " (median of 3 runs, TTFT p90 3,024 to 3,991 ms)"
    assert _runs({}) == ""


def test_an_older_latency_runs_accuracy_gives_way_to_the_newer_per_router_runs(
    results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latency.json's own accuracy table (a quick run, older learner) is shown only while no newer
    per-router accuracy run exists; after one, the section points at the accuracy section instead."""
    import bench.report.latency_accuracy

    monkeypatch.setattr(bench.report.latency_accuracy, "RESULTS", results_dir / "results")
    level = {"rate_rps": 5.0, "ttft_mdape_pct": 10.5, "ttft_median_signed_pct_error": -7.0}
    old = {"finished": "2026-01-01T00:00:00+0000", "command": "python -m bench.latency --quick",
           "settings": {}, "accuracy": [{"learner": "ridge-log", "levels": [level]}]}  # fmt: skip
    (results_dir / "results" / "latency.json").write_text(json.dumps(old))
    assert "TTFT accuracy, learner ridge-log" in bench.report.build().read_text()
    newer = {"finished": "2026-02-01T00:00:00+0000",
             "accuracy": [{"router": "predictor", "learner": "huber", "levels": [level]}]}  # fmt: skip
    (results_dir / "results" / "latency-steps-1.json").write_text(json.dumps(newer))
    text = bench.report.build().read_text()
    assert "TTFT accuracy, learner ridge-log" not in text
    assert "TTFT accuracy: see *Latency predictor: TTFT accuracy* below (latency-steps-1," in text
    assert "## Latency predictor: TTFT accuracy" in text


def test_the_scale_out_section_shows_the_uncrowded_cells_beside_the_crowded_ones() -> None:
    from bench.report.scaleout import scaleout_section
    from bench.scaleout import GOALS, summarise

    def r(n: int, sync: bool, cpu: float, lag: float | None = None) -> dict[str, Any]:
        return {"replicas": n, "sync": sync, "cpu_us_per_request": cpu, "p99_ms": 5.0, "staleness_p99_ms": lag,
                "failed": 0, "loop_wakes_per_request": 5.0, "received_per_request": 3.0, "replayer_cpu_s": 0.4}  # fmt: skip

    runs = {
        (1, False): [r(1, False, 500)],
        (4, False): [r(4, False, 700)],
        (4, True): [r(4, True, 1000, 8.0)],
    }
    cost = summarise(runs, {4: [r(4, True, 600, 6.5)]})
    text = "\n".join(scaleout_section({"goals": GOALS, "cost": {**cost, "by_rate": {"60": cost}}}))
    assert "**Cost of sharing, crowded**" in text and "**Cost of sharing, uncrowded**" in text
    assert "| 4 | 600.0 | 5.00 | 3.00 | 5.00 | 6.50 | 0.40 |" in text
    times = "\u00d7"  # the report prints a multiplication sign
    assert f"Effective scaling N {times} cost(1) / cost(N), uncrowded: 4: 3.33" in text
    assert f"Effective scaling N {times} cost(1) / cost(N): 4: 2.00" in text  # the crowded figure, as before
    assert "At 60 req/s, uncrowded (one EPP, peers replayed): effective scaling 4: 3.33" in text


def test_the_scale_out_section_shows_the_busy_replica_part() -> None:
    from bench.report.scaleout import scaleout_section
    from bench.scaleout import GOALS, crowding_summary, uncrowded_summary

    def r(n: int, cpu: float, lag: float | None) -> dict[str, Any]:
        return {"replicas": n, "sync": n > 1, "cpu_us_per_request": cpu, "p99_ms": 4.0, "staleness_p99_ms": lag,
                "failed": 0, "sent_per_request": 0.3, "received_per_request": 0.9, "replayer_cpu_s": 3.0}  # fmt: skip

    alone = {**r(1, 240, None), "sent_per_request": None, "received_per_request": None}  # sync off
    busy = {
        "rate": 1000.0,
        "alone": alone,
        **uncrowded_summary(240, {2: [r(2, 280, 6.0)], 4: [r(4, 320, 8.0)]}),
    }
    text = "\n".join(scaleout_section({"goals": GOALS, "busy": busy}))
    assert "**Cost of sharing to a busy replica** (1000 req/s per replica" in text
    dash = "\u2013"  # the report's mark for no figure
    assert f"| 1 | 240.0 | {dash} | {dash} | 4.00 | {dash} |" in text
    assert "| 4 | 320.0 | 0.30 | 0.90 | 4.00 | 8.00 |" in text
    assert "at this rate: 2: 1.71, 4: 3.00 (goals" in text
    assert "worst staleness p99 8.00 ms." in text
    assert "Control:" not in text  # a run without the control cells

    busy.update(crowding_summary(240, {2: [r(2, 280, 6.0)]}, {2: [{**r(2, 260, None), "sync": False}]}))
    text = "\n".join(scaleout_section({"goals": GOALS, "busy": busy}))
    assert (
        "Control: the same replayer beside replica 0 with sync off costs it 2: 1.08 \u00d7 one replica alone "
        "(CPU µs/request 2: 260.0); the sync's own cost, each round's synced cell less its control: 2: 20.0 µs "
        "a request, so on cores of their own (an estimate) N \u00d7 cost(1) / (cost(1) + that) = 2: 1.85."
    ) in text
