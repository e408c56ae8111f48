"""bench/latency.py's in-process parts run and report what the docs quote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.latency import ENDPOINTS, bench_prediction, bench_training, workload


def test_prediction_and_training_cells() -> None:
    cells = bench_prediction(5)
    assert [c["endpoints"] for c in cells] == list(ENDPOINTS)
    assert all(c["predict_us"]["p50"] > 0 and c["prepare_data_us"]["p50"] > 0 for c in cells)
    assert all(c["prepare_data_traffic_us"]["p50"] > 0 and c["prepare_over_product"] > 0 for c in cells)
    t = bench_training(3)
    assert t["rows_per_target"] == 1000 and t["cpu_share_of_one_core_pct"] > 0


def test_workload_is_deterministic() -> None:
    assert workload(5, 1) == workload(5, 1)
    assert len(workload(7, 2)) == 7


def test_mixed_workload_is_half_chat_with_slo_and_documents_without() -> None:
    import orjson

    from bench.latency import DOC_TOKENS, mixed_workload

    arrivals = mixed_workload(2000, 42)
    assert arrivals == mixed_workload(2000, 42)
    reqs = [r for a in arrivals for r in a]
    chats = [r for r in reqs if r[2] == "chat"]
    docs = [r for r in reqs if r[2] == "doc"]
    assert all(slo for _, slo, _ in chats) and not any(slo for _, slo, _ in docs)
    assert 0.45 < len(chats) / len(reqs) < 0.55  # "half the requests carry a TTFT SLO"
    assert max(len(a) for a in arrivals) > 1  # documents come in bursts
    doc_chars = [len(orjson.loads(b)["messages"][0]["content"]) for b, _, _ in docs]
    assert min(doc_chars) >= 4 * DOC_TOKENS[0] * 0.9 and max(doc_chars) <= 4 * DOC_TOKENS[1] * 1.1
    chat_systems = {orjson.loads(b)["messages"][0]["content"] for b, _, _ in chats}
    assert len(chat_systems) == 6  # shared system prompts: cacheable
    assert all(orjson.loads(b)["stream"] for b, _, _ in reqs)


def _level(met: int, of: int, tokens: int = 100) -> dict[str, object]:
    return {"rate_rps": 0.0, "slo_met": met, "slo_requests": of, "slo_met_pct": 100.0 * met / of,
            "output_tokens": tokens}  # fmt: skip


def test_judging_rate_is_the_first_where_1_3x_is_possible() -> None:
    from bench.latency import goodput_summary, judging_rate

    rates = [6.0, 9.0, 12.0]
    default = [_level(99, 100), _level(78, 100), _level(60, 100)]  # 78 % > 1/1.3: not yet
    mixed = [_level(100, 100), _level(95, 100), _level(90, 100, tokens=90)]
    for lv, r in zip(default + mixed, rates + rates, strict=True):
        lv["rate_rps"] = r
    runs = {"default": {"levels": default}, "predictor-mixed-slo": {"levels": mixed}}
    rows = goodput_summary(runs)
    assert [r["judged_router"] for r in rows] == ["predictor-mixed-slo"] * 3
    judge = judging_rate(rows)
    assert judge is not None and judge["rate_rps"] == 12.0
    assert judge["goodput_ratio_vs_default"] == 1.5
    assert judge["output_tokens_ratio_vs_default"] == 0.9
    assert rows[0]["default"]["goodput_ratio_vs_default"] == 1.0
    assert judging_rate(rows[:2]) is None  # the default never falls that low: no judging rate


def test_rederive_adds_the_in_window_throughput_goal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.common
    import bench.latency
    from bench.latency import rederive

    (tmp_path / "bench" / "results").mkdir(parents=True)
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path / "bench" / "results")
    monkeypatch.setattr(bench.latency, "ROOT", tmp_path)
    default, mixed = _level(60, 100), _level(95, 100)
    default["window_output_tokens_per_s"], mixed["window_output_tokens_per_s"] = 1000.0, 980.0
    default["window_completed_rps"], mixed["window_completed_rps"] = 10.0, 10.0
    higher_default, higher_mixed = _level(50, 100), _level(90, 100)
    higher_default["rate_rps"] = higher_mixed["rate_rps"] = 1.0
    higher_default["window_output_tokens_per_s"], higher_mixed["window_output_tokens_per_s"] = 1000.0, 800.0
    higher_default["window_completed_rps"], higher_mixed["window_completed_rps"] = 10.0, 9.9
    runs = {"default": {"levels": [default, higher_default]},
            "predictor-mixed-slo": {"levels": [mixed, higher_mixed]}}  # fmt: skip
    (tmp_path / "bench" / "results" / "x.json").write_text(json.dumps({"goodput_runs": runs, "goals": {}}))
    goals = rederive("x")["goals"]
    assert goals["window_output_tokens_ratio_at_judging_rate"] == {"goal": 0.97, "value": 0.98, "met": True}
    assert goals["window_completed_requests_ratio_at_judging_rate"]["value"] == 1.0
    # from the judging rate up, the worst rate counts
    assert goals["window_output_tokens_ratio_min_from_judging_rate"] == {
        "goal": 0.97,
        "value": 0.8,
        "met": False,
    }
    assert goals["window_completed_requests_ratio_min_from_judging_rate"]["value"] == 0.99
    assert json.loads((tmp_path / "bench" / "results" / "x.json").read_text())["goodput"][0]["judged_router"]


def test_a_held_rate_is_judged_over_all_its_windows() -> None:
    """A steady-load run: the windows are summed (one window's swing is not a throughput loss)."""
    from bench.latency import goodput_summary, window_goals

    def window(met: int, done: float, tokens: float) -> dict[str, object]:
        lv = _level(met, 100)
        lv.update(rate_rps=12.0, window_completed_rps=done, window_output_tokens_per_s=tokens)
        return lv

    runs = {
        "default": {"levels": [window(60, 10.0, 1000.0), window(70, 10.0, 1000.0)]},
        "predictor-mixed-slo": {"levels": [window(95, 8.0, 800.0), window(100, 11.8, 1180.0)]},
    }
    rows = goodput_summary(runs)
    goals = window_goals(rows, rows[0])
    assert goals["goodput_ratio_held_rate"] == {"goal": 1.3, "value": 1.5, "met": True}
    assert goals["window_completed_requests_ratio_held_rate"] == {"goal": 0.97, "value": 0.99, "met": True}
    assert goals["window_output_tokens_ratio_held_rate"]["value"] == 0.99
    assert not any(k.endswith("_min_from_judging_rate") for k in goals)
