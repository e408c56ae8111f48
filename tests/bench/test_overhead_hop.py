"""The whole-hop accounting of bench/overhead.py: fair floors, ratios within a round, medians."""

# The report is typeset: the multiplication sign is meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.overhead import HOP_RATE, SPECS, _pool, capacity_cell, derive_hop, p50_by_round
from bench.paths import LEAN
from bench.report.overhead import hop_section


def cap(rps: float, envoy: float, extproc: float) -> dict[str, Any]:
    return {
        "achieved_rps": rps,
        "cpu_us_per_req": {"envoy": envoy, "extproc": extproc, "total": envoy + extproc},
    }


def result() -> dict[str, Any]:
    # Round 2 is disturbed for both paths alike: the within-round ratio stays 1.2, a ratio of medians
    # across rounds would not.
    rounds = {
        "floor-h2": [cap(1000, 100, 100), cap(500, 200, 200), cap(1000, 100, 100)],
        "epp": [cap(900, 120, 120), cap(450, 240, 240), cap(800, 150, 150)],
        "floor-h2-lean": [cap(2000, 50, 50), cap(2000, 50, 50), cap(2000, 50, 50)],
        "epp-lean": [cap(1500, 60, 90), cap(1500, 60, 90), cap(1500, 60, 90)],
    }
    p50 = {"floor-h2": 1.0, "epp": 1.1, "floor-h2-lean": 0.8, "epp-lean": 1.0}
    return {
        "capacity_rounds": rounds,
        "floors": {"epp": "floor-h2", "epp-lean": "floor-h2-lean"},
        "ladder": {name: {str(HOP_RATE): {"p50_ms": v}} for name, v in p50.items()},
        "paths": {name: name for name in rounds},
    }


def test_hop_ratios_are_medians_of_ratios_within_a_round() -> None:
    hop = derive_hop(result())
    epp = hop["paths"]["epp"]
    assert epp["cpu_ratio"] == 1.2  # rounds: 1.2, 1.2, 1.5
    assert epp["capacity_ratio"] == 0.9  # 0.9, 0.9, 0.8
    assert epp["cpu_us_per_req"] == {"envoy": 150.0, "extproc": 150.0, "total": 300.0}
    assert epp["added_p50_ms"] == 0.1
    lean = hop["paths"]["epp-lean"]
    assert lean["cpu_ratio"] == 1.5 and lean["cpu_ratio_vs_gie_floor"] == 0.75
    met = {(g["path"], g["goal"]): g["met"] for g in hop["goals"]}
    assert met == {
        ("epp", "cpu_ratio"): True,
        ("epp", "capacity_ratio"): True,
        ("epp", "added_p50_ms"): True,
        ("epp-lean", "cpu_ratio"): False,
        ("epp-lean", "capacity_ratio"): False,
        ("epp-lean", "added_p50_ms"): False,
    }


def test_added_p50_is_the_median_of_differences_within_a_round() -> None:
    """A round slow for both paths moves neither; one slow for the EPP alone is outvoted."""
    r = result()
    r["hop_p50_rounds"] = {
        "floor-h2": [1.0, 3.0, 1.0],  # round 2: the machine was busy for both
        "epp": [1.1, 3.12, 1.5],  # round 3: the EPP's windows alone were disturbed
        "floor-h2-lean": [0.8, 0.8, 0.8],
        "epp-lean": [0.9, 0.95, None],  # a round the path did not run
    }
    epp = derive_hop(r)["paths"]["epp"]
    assert epp["added_p50_ms"] == 0.12  # rounds: 0.1, 0.12, 0.5
    assert epp["added_p50_ms_rounds"] == [0.1, 0.12, 0.5]
    assert epp["added_p50_ms_pooled"] == 0.1  # the ladder's pooled cells, kept beside it
    lean = derive_hop(r)["paths"]["epp-lean"]
    assert lean["added_p50_ms"] == 0.125  # the median of the two rounds both ran


def testp50_by_round_pools_a_rounds_slices() -> None:
    windows = [
        {"round": 0, "_lat_ms": [1.0, 2.0]},
        {"round": 1, "_lat_ms": [5.0]},
        {"round": 0, "_lat_ms": [3.0]},  # round 0's second slice
    ]
    assert p50_by_round(windows, 3) == [2.0, 5.0, None]


def window(rnd: int, lat_ms: list[float]) -> dict[str, Any]:
    n = len(lat_ms)
    return {
        "round": rnd,
        "_lat_ms": lat_ms,
        "ok": n,
        "offered": n,
        "errors": 0,
        "wall_s": 0.5,
        "client_late_p99_ms": 0.0,
        "p99_ms": sorted(lat_ms)[-1],
        "cpu_s": {"envoy": 0.01},
    }


def test_a_cell_is_sustained_by_rounds_not_by_slices() -> None:
    """One slow request in a 100-request slice is its p99, not its round's: the round sustains."""
    slow_slice = window(0, [1.0] * 99 + [30.0])
    round0 = [slow_slice] + [window(0, [1.0] * 100) for _ in range(3)]
    cell = _pool([*round0, window(1, [1.0] * 100)])
    assert cell["rounds"] == 2 and cell["sustained"]
    slow_round = [window(2, [1.0] * 90 + [30.0] * 10)]
    assert not _pool([*round0, *slow_round])["sustained"]


def test_capacity_of_a_round_is_its_slices_requests_over_their_time() -> None:
    fast, slow = window(0, [1.0] * 300), window(0, [1.0] * 100)  # 0.5 s each
    fast["cpu_s"], slow["cpu_s"] = {"envoy": 0.03, "extproc": 0.03}, {"envoy": 0.01, "extproc": 0.03}
    c = capacity_cell([fast, slow])
    assert c["achieved_rps"] == 400.0  # 400 requests in 1 s, not the mean of 600 and 200 per second
    assert c["cpu_us_per_req"] == {"envoy": 100.0, "extproc": 150.0, "total": 250.0}
    assert "_lat_ms" not in c and "sustained" not in c


def test_lean_saves_envoys_share_per_config() -> None:
    saved = derive_hop(result())["lean_saves"]
    assert set(saved) == {"default"}  # prefix-heavy has no rounds here
    assert saved["default"]["envoy_us_per_req"] == {"gie": 150.0, "lean": 60.0}  # medians of rounds
    assert saved["default"]["envoy_share_saved"] == 0.6
    assert saved["default"]["total_share_saved"] == 0.5


def test_report_prints_each_goal_as_pass_or_fail() -> None:
    r = result()
    r["derived"] = {"hop": derive_hop(r)}
    text = "\n".join(hop_section(r))
    assert "- PASS: epp cpu_ratio 1.20× ≤ 1.25× (over floor-h2)" in text
    assert "- FAIL: epp-lean cpu_ratio 1.50× ≤ 1.25× (over floor-h2-lean)" in text
    assert "| default | 150 | 60 | 60% | 50% |" in text


def test_every_epp_path_has_a_fair_floor_under_the_same_envoy_config() -> None:
    by_name = {s.name: s for s in SPECS}
    for s in SPECS:
        if s.floor:
            floor = by_name[s.floor]
            assert floor.kind == "floor" and floor.transport == "h2"
            assert dict(floor.envoy) == dict(s.envoy)
    assert dict(by_name["epp-lean"].envoy) == LEAN and by_name["floor-h2-lean"].response_phases == "none"
    assert {"vllm-router", "sglang-router"} <= set(by_name)  # the Rust routers in every report
