"""bench/latency_replay.py: a trace written like the producer's is replayed on its schedule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from bench.latency_replay import load, replay, report
from epp.director.latency.model import MIN_SAMPLES, LatencyModel, features


def write_trace(tmp: Path, n: int = 200) -> Path:
    """One endpoint, one request every 50 ms, TTFT = 20 ms + 40 ms per 1000 uncached tokens (EPP side);
    the client sees each 3 ms later.  Two levels of 5 s."""
    rng = np.random.default_rng(0)
    rows, client = [], []
    for i in range(n):
        sent = 100.0 + 0.05 * i
        tokens = float(rng.uniform(100, 3000))
        x = features(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), tokens)[0]
        ttft = 20.0 + 0.04 * tokens
        rows.append({"at": sent + 0.001 + ttft / 1000, "endpoint": "e", "x": x.tolist(), "ttft_ms": ttft})
        level = 0 if sent < 105.0 else 1
        client.append({"level": level, "at": sent - (100.0 if level == 0 else 105.0), "sent": sent,
                       "ttft_ms": ttft + 4.0, "status": 200})  # fmt: skip
    path = tmp / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    path.with_suffix(".client.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in client))
    return path


def test_replay_learns_online_and_reports_per_level(tmp_path: Path) -> None:
    trace = load(write_trace(tmp_path), seconds=5.0)
    assert [r.level for r in trace.rows[:3]] == [0, 0, 0] and trace.rows[-1].level == 1
    assert trace.level_starts == [100.0, 105.0]
    assert all(r.client_ttft_ms is not None for r in trace.rows)  # every row found its client request
    replay(trace.rows, LatencyModel(), interval=1.0)
    # nothing is predicted before the first training on MIN_SAMPLES rows (at least 1 s in)
    first = next(i for i, r in enumerate(trace.rows) if r.predicted_ms is not None)
    assert first >= MIN_SAMPLES and trace.rows[first].dispatched >= 101.0
    out = report(trace, client=True)
    assert set(out) == {0, 1}
    assert out[1] < 2.0  # a linear truth, learnt: the EPP-side error is small once trained
