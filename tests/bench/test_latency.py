"""bench/latency.py's in-process parts run and report what the docs quote."""

from __future__ import annotations

from bench.latency import ENDPOINTS, bench_prediction, bench_training, workload


def test_prediction_and_training_cells() -> None:
    cells = bench_prediction(5)
    assert [c["endpoints"] for c in cells] == list(ENDPOINTS)
    assert all(c["predict_us"]["p50"] > 0 and c["prepare_data_us"]["p50"] > 0 for c in cells)
    t = bench_training(3)
    assert t["rows_per_target"] == 1000 and t["cpu_share_of_one_core_pct"] > 0


def test_workload_is_deterministic() -> None:
    assert workload(5, 1) == workload(5, 1)
    assert len(workload(7, 2)) == 7
