"""bench/envoy_segments: Envoy's own timing of a request's segments, parsed from its access log."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from bench.common import added_over_floor
from bench.envoy_segments import SEGMENTS, TAG, Row, logged, medians, rows
from bench.httpload import post
from bench.paths import EPP, FLOOR_H2, Lab


def test_rows_read_the_tagged_lines_and_skip_what_envoy_could_not_time() -> None:
    lines = [
        f"{TAG} 1733476800.123456 200 150 700 180 240 9 1180",
        "ACCESS POST /v1/chat/completions 200 - upstream=127.0.0.1:1 dur=1ms",  # another format
        f"{TAG} 1733476800.2 503 150 - - - - 400",  # no upstream reached: not timed
        f"{TAG} 1733476800.3 200 1 2 3",  # cut short
    ]
    assert rows(lines) == [Row(1733476800.123456, 200, (150, 700, 180, 240, 9, 1180))]


def test_medians_per_segment_over_successful_requests_only() -> None:
    window = [
        Row(0.0, 200, (1, 10, 100, 1000, 1, 2000)),
        Row(0.0, 200, (3, 30, 300, 3000, 3, 4000)),
        Row(0.0, 200, (2, 20, 200, 2000, 2, 3000)),
        Row(0.0, 500, (99, 99, 99, 99, 99, 99)),
    ]
    assert medians(window) == dict(zip(SEGMENTS, (2.0, 20.0, 200.0, 2000.0, 2.0, 3000.0), strict=True))
    assert medians([Row(0.0, 503, (1, 1, 1, 1, 1, 1))]) == {}


def test_added_is_the_median_over_rounds_of_each_rounds_difference() -> None:
    def cell(request: float, total: float) -> dict[str, float]:
        return {"request": request, "total": total}

    cells = {
        "floor-h2": [cell(600, 1100), cell(700, 1200), cell(650, 1150)],
        "epp": [cell(700, 1300), cell(760, 1260), {}],  # a round with no successful request
    }
    got = added_over_floor(cells, "floor-h2", SEGMENTS)
    assert got == {"epp": {**dict.fromkeys(SEGMENTS), "request": 80.0, "total": 130.0}}


@pytest.mark.e2e
async def test_a_real_envoy_logs_every_segment_of_each_request() -> None:
    body = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
    with tempfile.TemporaryDirectory() as tmp:
        specs = [logged(FLOOR_H2, Path(tmp)), logged(EPP, Path(tmp))]
        async with Lab(specs, upstreams=2, idle_window_s=0.2) as lab:
            for path in lab.paths.values():
                for _ in range(3):
                    r = await path.client().send(post("/v1/chat/completions", body), timeout=10)
                    assert r.status == 200
            for spec in specs:
                log = Path(tmp) / f"{spec.name}.log"
                got: list[Row] = []
                for _ in range(100):  # the demo Envoy flushes its access log every 100 ms
                    got = rows(log.read_text().splitlines()) if log.exists() else []
                    if len(got) == 3:
                        break
                    await asyncio.sleep(0.05)
                assert len(got) == 3, spec.name
                for row in got:
                    seg = dict(zip(SEGMENTS, row.us, strict=True))
                    assert row.status == 200
                    assert 0 < seg["request"] <= seg["total"]
                    assert 0 < seg["upstream"] < seg["total"]
                    assert seg["request"] + seg["upstream"] + seg["response_headers"] <= seg["total"]
