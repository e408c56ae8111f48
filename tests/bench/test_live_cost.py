"""bench/live_cost: a live server's CPU and instructions per request, against the floor's."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.live_cost import FLOOR, callgrind_total, measure, ratios
from epp_sim.demo.procs import SimFleet


def test_a_dump_s_instructions_are_the_sum_of_its_threads_totals(tmp_path: Path) -> None:
    main, fold = tmp_path / "cg.7.1-01", tmp_path / "cg.7.1-02"
    main.write_text("events: Ir\nfn=x\n0 5\nsummary: 1000\ntotals: 1000\n")
    fold.write_text("events: Ir\ntotals: 234\n")
    assert callgrind_total([main, fold]) == 1234
    assert callgrind_total([]) == 0


def test_each_config_is_read_against_the_floor() -> None:
    cells: dict[str, dict[str, Any]] = {
        FLOOR: {"cpu_us_per_request": 50.0},
        "default": {"cpu_us_per_request": 100.0},
        "prefix-heavy": {"cpu_us_per_request": None},
    }
    assert ratios(cells, "cpu_us_per_request") == {"default": 2.0, "prefix-heavy": None}
    assert ratios({"default": {"cpu_us_per_request": 1.0}}, "cpu_us_per_request") == {"default": None}


@pytest.mark.e2e
async def test_the_floor_and_the_epp_are_measured_live_over_loopback() -> None:
    async with SimFleet(2, "--time-scale", "0.02") as fleet:
        floor = await measure(FLOOR, fleet.hostports, 1.0, callgrind=False)
        epp = await measure("default", fleet.hostports, 1.0, callgrind=False)
    for cell in (floor, epp):
        assert cell["routed"] > 100 and cell["failed"] == 0
        assert cell["cpu_us_per_request"] > 0
        assert cell["cpu_us_per_request"] == pytest.approx(
            cell["user_us_per_request"] + cell["system_us_per_request"], abs=0.2
        )


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
async def test_the_floor_s_instructions_are_counted_under_callgrind_with_idle_subtracted() -> None:
    async with SimFleet(1, "--time-scale", "0.02") as fleet:
        cell = await measure(FLOOR, fleet.hostports, 1.0, callgrind=True)
    assert cell["routed"] > 0 and cell["failed"] == 0
    # a no-op request is tens of thousands of instructions at least, and the idle floor barely runs
    assert cell["instructions_per_request"] > 50_000
    assert cell["idle_instructions_per_s"] < cell["instructions_per_request"] * cell["req_per_s"]
