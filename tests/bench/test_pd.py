"""bench/pd.py: ratios to aggregated, the prefix-decider check, and its report section."""

# The report is typeset markdown: the multiplication and minus signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.pd import FULL, MODES, derive, noise, summarize
from bench.report.pd import pd_section
from epp_sim.demo.loadgen import Result


def _cell(workload: str, mode: str, ttft: float, itl: float, tput: float) -> dict[str, Any]:
    return {
        "workload": workload, "mode": mode, "ok": 10, "requests": 10,
        "ttft_mean_ms": ttft, "ttft_p90_ms": ttft * 2, "itl_mean_ms": itl, "itl_p90_ms": itl * 1.2,
        "e2e_mean_ms": ttft + 100 * itl, "e2e_p90_ms": 2 * (ttft + 100 * itl), "output_tokens_per_s": tput,
    }  # fmt: skip


def test_ratios_are_to_aggregated_and_a_decider_between_the_others_passes() -> None:
    cells = [
        _cell("long", "aggregated", 300.0, 14.0, 1600.0),
        _cell("long", "always", 900.0, 8.0, 1550.0),
        _cell("long", "prefix", 880.0, 8.1, 1560.0),
    ]
    d = derive(cells)
    assert d["ratios_to_aggregated"]["long"]["always"]["ttft_mean_ms"] == 3.0
    assert d["ratios_to_aggregated"]["long"]["aggregated"]["itl_mean_ms"] == 1.0
    assert d["prefix_never_worse_than_both"] is True


def test_a_decider_worse_than_both_is_named() -> None:
    cells = [
        _cell("short", "aggregated", 20.0, 6.4, 1500.0),
        _cell("short", "always", 40.0, 6.5, 1500.0),
        _cell("short", "prefix", 60.0, 6.5, 1200.0),
    ]
    d = derive(cells)
    assert d["prefix_never_worse_than_both"] is False
    beyond = {w["metric"] for w in d["prefix_worse_than_both_beyond_tolerance"]}
    assert beyond >= {"ttft_mean_ms", "output_tokens_per_s"}
    assert "itl_mean_ms" not in beyond  # equal to always-disaggregate: not worse than both
    small = [
        _cell("short", "aggregated", 20.0, 6.4, 1500.0),
        _cell("short", "always", 40.0, 6.6, 1500.0),
        _cell("short", "prefix", 30.0, 6.9, 1500.0),
    ]
    d = derive(small)
    assert [
        (w["metric"], w["margin"]) for w in d["prefix_worse_than_both"] if w["metric"] == "itl_mean_ms"
    ] == [("itl_mean_ms", 0.045)]  # reported, however small
    assert d["prefix_never_worse_than_both"] is True  # within the tolerance


def test_summary_takes_itl_per_request_and_ignores_failures() -> None:
    ok = Result(status=200, ttft=0.1, latency=1.1, output_tokens=101)
    failed = Result(status=503)
    s = summarize([ok, failed], wall=2.0)
    assert s["ok"] == 1 and s["errors"] == {"HTTP 503": 1}
    assert s["itl_mean_ms"] == 10.0
    assert s["output_tokens_per_s"] == 50.5


def test_report_shows_losses_as_plainly_as_wins() -> None:
    cells = [
        _cell("long", "aggregated", 300.0, 14.0, 1600.0),
        _cell("long", "always", 900.0, 8.0, 1600.0),
        _cell("long", "prefix", 900.0, 8.0, 1600.0),
    ]
    doc = {
        "settings": {"duration_s": FULL.duration_s, "workloads": [
            {"name": "long", "title": "long", "rate": 6.5, "prompt_tokens": 5000, "output_tokens": 250}]},
        "pods": 4, "prefill_pods": 2, "modes": MODES, "cells": cells, "derived": derive(cells),
    }  # fmt: skip
    text = "\n".join(pd_section(doc))
    assert "*3.00× (+200%, worse)*" in text  # TTFT
    assert "**0.57× (−43%, better)**" in text  # ITL
    assert "never worse than both" in text
    cells[2] = _cell("long", "prefix", 1200.0, 8.0, 1600.0)  # TTFT and E2E now worse than both
    doc["derived"] = derive(cells)
    text = "\n".join(pd_section(doc))
    assert "| long | **no** | **+33%** |" in text  # TTFT mean: 1200 against the worse, 900
    assert "worse than both on long (ttft_mean_ms +33%)" in text


def test_each_prefix_mode_is_judged_against_the_other_two_and_noise_is_reported() -> None:
    """The symmetric-fleet mode gets its own verdict; the 2 + 2 one keeps its key."""
    cells = [
        _cell("short", "aggregated", 20.0, 6.4, 1500.0),
        _cell("short", "always", 40.0, 6.6, 1500.0),
        _cell("short", "prefix", 30.0, 6.9, 1500.0),  # ITL worse than both by 4.5%: within tolerance
        _cell("short", "symmetric", 21.0, 6.4, 1500.0),
    ]
    d = derive(cells)
    assert d["never_worse_than_both"] == {"prefix": True, "symmetric": True}
    assert d["verdicts"]["prefix"]["short"]["worst_metric"] == "itl_mean_ms"
    assert d["verdicts"]["prefix"]["short"]["worst_margin"] == 0.045
    assert d["verdicts"]["symmetric"]["short"]["margins"]["ttft_mean_ms"] == round(21 / 40 - 1, 3)
    assert {w["mode"] for w in d["prefix_worse_than_both"]} == {"prefix"}
    cells[3] = _cell("short", "symmetric", 50.0, 6.4, 1500.0)
    d = derive(cells)
    assert d["never_worse_than_both"] == {"prefix": True, "symmetric": False}
    assert d["prefix_never_worse_than_both"] is True  # the 2 + 2 mode's verdict alone
    assert noise(cells[0], _cell("short", "aggregated", 22.0, 6.4, 1500.0))["ttft_mean_ms"] == 0.1
    doc = {
        "settings": {"duration_s": 40.0, "workloads": [
            {"name": "short", "title": "short", "rate": 8.0, "prompt_tokens": 200, "output_tokens": 200}]},
        "pods": 4, "prefill_pods": 2, "modes": MODES, "cells": cells, "derived": d,
        "repeats": [{"workload": "short", "mode": "aggregated", "noise": {"ttft_mean_ms": 0.1}}],
    }  # fmt: skip
    text = "\n".join(pd_section(doc))
    assert "| short: aggregated (4 pods, default EPP config) | 10.0 |" in text
    assert MODES["symmetric"] in text and "| short | **no** | **+25%** |" in text
    assert "| short | no, by 4% (within 10%) |" in text  # the 2 + 2 decider's small ITL loss, still said


def test_the_declined_profile_and_dedicated_modes_get_their_own_verdicts() -> None:
    """Every decider mode is judged against the same two references, whatever its fleet."""
    cells = [
        _cell("short", "aggregated", 20.0, 6.4, 1500.0),
        _cell("short", "always", 40.0, 6.6, 1500.0),
        _cell("short", "prefix", 30.0, 6.9, 1500.0),
        _cell("short", "declined", 21.0, 6.4, 1500.0),
        _cell("short", "symmetric-dedicated", 22.0, 7.0, 1500.0),  # ITL worse than both
    ]
    d = derive(cells)
    assert d["never_worse_than_both"] == {
        "prefix": True,
        "declined": True,
        "symmetric-dedicated": True,  # 6% is within the tolerance, but named below
    }
    assert d["verdicts"]["declined"]["short"]["worst_margin"] <= 0
    assert {w["mode"] for w in d["prefix_worse_than_both"]} == {"prefix", "symmetric-dedicated"}
    assert d["ratios_to_aggregated"]["short"]["declined"]["ttft_mean_ms"] == 1.05
