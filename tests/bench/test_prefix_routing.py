"""The cache-routing comparison's reductions: follow-up turns' cache use, the goals' rate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from bench.common import CONFIGS
from bench.prefix_routing import (
    FULL,
    JUDGED,
    NO_EVENTS,
    PRECISE_TYPE,
    PROFILES,
    ROUTERS,
    derive_precise,
    derive_shared,
    followups,
    median_conversation,
    median_run,
    merge,
    prediction_breakdown,
    runs_per_cell,
    shared_sections,
    unique_tokens,
)


def _req(
    session: str, rnd: int, prompt: int, cached: int, out: int = 10, start: float = 0.0
) -> dict[str, Any]:
    return {
        "start_time": start,
        "error": None,
        "info": {
            "extra_info": {"user_session": session, "chat_round": rnd},
            "response_metrics": {
                "server_usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": out,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
                "output_token_times": [start + 0.05],
            },
        },
    }


def test_followups_count_turns_after_the_first_only() -> None:
    per = [
        _req("a", 2, 200, 100),  # out of order on purpose
        _req("a", 1, 100, 0),
        _req("b", 1, 100, 50),
        _req("b", 2, 200, 0),
        _req("a", 3, 300, 200),
    ]
    r = followups(per)
    assert r["sessions"] == 2
    assert r["followup_turns"] == 3
    assert r["followup_hit_rate"] == round(300 / 700, 4)
    # context left by the previous turn: a2 110, b2 110, a3 210; found cached: 100, 0, 200
    assert r["followup_context_reuse"] == round(300 / 430, 4)
    assert r["followup_ttft_ms"]["p50"] == 50.0


def test_failed_turns_and_missing_usage_are_skipped() -> None:
    bad = _req("a", 2, 200, 200)
    bad["error"] = {"message": "boom"}
    r = followups([_req("a", 1, 100, 0), bad])
    assert r["followup_turns"] == 0
    assert r["followup_hit_rate"] is None


def _cell(router: str, rate: float, p90: float, tput: float, ok: float = 1.0) -> dict[str, Any]:
    return {
        "router": router,
        "rate": rate,
        "ttft_ms": {"p90": p90},
        "output_tokens_per_s": tput,
        "success_rate": ok,
    }


def test_goals_are_judged_at_the_highest_rate_round_robin_completes() -> None:
    cells = [
        _cell("round-robin", 10, 1000, 100),
        _cell("round-robin", 20, 5000, 150),
        _cell("round-robin", 30, 9000, 100, ok=0.5),
        _cell("epp-precise", 10, 100, 100),
        _cell("epp-precise", 20, 400, 320),
        _cell("epp-precise", 30, 500, 400),
        _cell("sglang-cache-aware", 20, 600, 300),
    ]
    d = derive_shared(cells, ["round-robin", "epp-precise", "sglang-cache-aware"])
    assert d["highest_rate_rr_completes"] == 20
    g = d["goals"]["epp-precise"]
    assert g["at_rate"] == 20
    assert g["ttft_p90_vs_rr"] == {"goal": 0.1, "value": 0.08, "met": True}
    assert g["throughput_vs_rr"]["value"] == round(320 / 150, 3)
    assert g["throughput_vs_rr"]["met"]
    assert g["ttft_p90_vs_sglang"] == {"goal": 0.8, "value": round(400 / 600, 3), "met": True}
    assert g["peak_throughput_vs_rr"]["value"] == round(400 / 150, 3)


def _full(router: str, rate: float, p90: float, tput: float, r: float | None = None) -> dict[str, Any]:
    return {
        **_cell(router, rate, p90, tput),
        "requests": 10,
        "fleet": {"prefix_hit_rate": 0.5},
        "router_cpu_s": {"epp": 1.0},
        "wall_s": 10.0,
        "reuse_correlation": r,
    }


def test_the_judged_sizing_is_llm_ds_73_percent_and_the_working_set_still_exceeds_the_fleet() -> None:
    judged = [p for p in PROFILES if p.judged]
    assert [p.name for p in judged] == [JUDGED]
    wl = judged[0].workload
    assert 0.70 <= wl.working_set_tokens / wl.fleet_kv_tokens <= 0.76  # system prompts: ~73%
    assert wl.kv_blocks * wl.block_size < wl.working_set_tokens  # one replica cannot hold the groups
    assert unique_tokens(wl) > wl.fleet_kv_tokens  # every unique token still exceeds the fleet
    pressure = next(p for p in PROFILES if p.name == "cache-pressure").workload
    assert pressure.working_set_tokens > pressure.fleet_kv_tokens


def test_a_result_from_before_the_profiles_reads_as_the_cache_pressure_profile() -> None:
    old = {"shared": {"cells": [_full("epp-precise", 40, 1, 1, 0.5)], "routers": {}}}
    assert list(shared_sections(old)) == ["cache-pressure"]


def test_merge_keeps_each_profiles_cells_it_did_not_measure_again() -> None:
    def section(cells: list[dict[str, Any]]) -> dict[str, Any]:
        return {"routers": {c["router"]: c["router"] for c in cells}, "cells": cells, "workload": None}

    previous = {
        "shared": {
            JUDGED: section([_full("round-robin", 40, 9000, 100), _full("epp-precise", 40, 900, 300, 0.5)]),
            "cache-pressure": section([_full("round-robin", 40, 9000, 100)]),
        }
    }
    result: dict[str, Any] = {
        "judged_profile": JUDGED,
        "shared": {JUDGED: section([_full("epp-precise", 40, 800, 310, 0.95)])},
    }
    merge(result, previous, ["epp-precise"])
    cells = result["shared"][JUDGED]["cells"]
    assert sorted((c["router"], c["output_tokens_per_s"]) for c in cells) == [
        ("epp-precise", 310),
        ("round-robin", 100),
    ]
    assert "cache-pressure" in result["shared"]
    assert result["shared"][JUDGED]["derived"]["goals"]["epp-precise"]["throughput_vs_rr"]["value"] == 3.1


def test_the_correlation_goal_is_judged_on_the_judged_profile_and_the_conversations() -> None:
    doc = {
        "judged_profile": JUDGED,
        "shared": {
            JUDGED: {"cells": [_full("epp-precise", 40, 1, 1, 0.95)]},
            "cache-pressure": {"cells": [_full("epp-precise", 40, 1, 1, 0.4)]},
        },
        "conversation": {"cells": [_full("epp-precise", 0, 1, 1, 0.92)]},
    }
    d = derive_precise(doc)
    assert d is not None
    judged = [g for g in d["goals"] if g["judged"]]
    assert [(g["value"], g["met"]) for g in judged] == [(0.92, True)]
    reported = [g for g in d["goals"] if not g["judged"]]
    assert [(g["profile"], g["value"], g["met"]) for g in reported] == [("cache-pressure", 0.4, False)]


def _run(p90: float, r: float, at: str) -> dict[str, Any]:
    cell = _full("epp-precise", 48, p90, 4000 + p90 / 10, r)
    cell["ttft_ms"]["p50"] = p90 / 2
    cell["measured_at"] = at
    return cell


def test_a_repeated_cell_is_its_median_run_whole_with_every_runs_numbers() -> None:
    runs = [_run(4000, 0.93, "a"), _run(3000, 0.95, "b"), _run(3500, 0.90, "c")]
    cell = median_run(runs)
    # the fields are one run's (the median TTFT p90), not a mix
    assert (cell["ttft_ms"]["p90"], cell["output_tokens_per_s"], cell["measured_at"]) == (3500, 4350, "c")
    assert [r["ttft_p90_ms"] for r in cell["runs"]] == [4000, 3000, 3500]
    assert cell["medians"]["reuse_correlation"] == 0.93
    assert cell["medians"]["ttft_p90_ms"] == 3500
    assert median_run(runs[:1]) is runs[0]
    # the r goal reads the median over the runs, not the median-TTFT run's own r (0.90)
    d = derive_precise({"judged_profile": JUDGED, "shared": {JUDGED: {"cells": [cell]}}})
    assert d is not None
    assert [g["value"] for g in d["goals"] if g["judged"]] == [0.93]
    assert "median of 3 runs, 0.900 to 0.950" in d["lines"][0]


def test_an_even_count_takes_the_lower_middle_and_a_failed_run_counts_as_the_slowest() -> None:
    fail = {"router": "epp-precise", "rate": 48, "failed": "boom"}
    cell = median_run([_run(4000, 0.9, "a"), fail, _run(3000, 0.9, "b"), _run(3500, 0.9, "c")])
    assert cell["ttft_ms"]["p90"] == 3500
    assert {"failed": True} in cell["runs"]
    assert "failed" in median_run([fail, dict(fail), _run(3000, 0.9, "b")])


def test_a_repeated_conversation_cell_is_its_median_follow_up_run() -> None:
    runs = [
        {"router": "epp-precise", "followup_hit_rate": h, "reuse_correlation": r}
        for h, r in [(0.93, 0.99), (0.91, 0.98), (0.92, 0.97), (0.95, 0.99)]
    ]
    cell = median_conversation(runs)
    assert (cell["followup_hit_rate"], cell["reuse_correlation"]) == (0.92, 0.97)
    assert [r["followup_hit_rate"] for r in cell["runs"]] == [0.93, 0.91, 0.92, 0.95]


def test_prediction_breakdown_splits_the_error_by_side() -> None:
    fields = ["predicted", "observed", "firstByteMs"]
    rows = [[100, 100, 10.0], [200, 200, 20.0], [300, 0, 2000.0], [0, 100, 30.0], [50, 50, 1500.0]]
    b = prediction_breakdown({"fields": fields, "rows": rows})
    assert b is not None
    assert (b["samples"], b["over_predicted"], b["under_predicted"]) == (5, 1, 1)
    assert b["squared_error_share_over"] == round(300**2 / (300**2 + 100**2), 3)
    assert b["first_byte_over_1s"] == 2
    assert b["over_predicted_by_holder"] == {"computing": 0, "computed_only": 0, "none_in_flight": 1}
    assert b["holder_decoding_ms_median_over_predicted"] is None  # rows without the field (older EPPs)
    assert prediction_breakdown(None) is None


def test_prediction_breakdown_splits_over_predictions_by_holder_and_decode_age() -> None:
    fields = ["predicted", "observed", "firstByteMs", "holdersComputedAtPick", "holdersUncomputedAtPick",
              "latestHolderDecodingMsAtPick"]  # fmt: skip
    rows = [
        [100, 0, 3000.0, 1, 0, 5000.0],  # computed holder only, missed: decoding 5 s
        [100, 0, 3000.0, 2, 0, 4000.0],
        [100, 100, 500.0, 1, 0, 800.0],  # computed holder only, found
        [100, 0, 3000.0, 1, 1, 900.0],  # a holder still computing, missed
        [100, 100, 20.0, 0, 0, -1.0],
    ]
    b = prediction_breakdown({"fields": fields, "rows": rows})
    assert b is not None
    assert b["over_predicted_by_holder"] == {"computing": 1, "computed_only": 2, "none_in_flight": 0}
    assert b["holder_decoding_ms_median_over_predicted"] == 4500.0
    assert b["holder_decoding_ms_median_found"] == 800.0


def test_every_epp_router_config_builds_and_the_event_routers_run_the_precise_scorer(tmp_path: Path) -> None:
    """A router's config is a real file the registry accepts once the harness has filled in the
    replicas' event sockets; a router whose replicas publish KV events runs the precise scorer."""
    from epp.app.build import build
    from epp.app.registry import default_registry
    from epp.config.load import load_config_file

    for r in ROUTERS:
        if r.kind != "epp":
            continue
        doc = yaml.safe_load((CONFIGS / r.epp_config).read_text())
        precise = [p for p in doc["plugins"] if p["type"] == PRECISE_TYPE]
        assert bool(precise) or not r.kv_events, r.name
        for p in precise:  # what Stack.epp_config does with the fleet's listeners
            p["parameters"]["kvEventsConfig"]["endpoints"] = {"127.0.0.1:8000": "tcp://127.0.0.1:9"}
        path = tmp_path / f"{r.name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        assert build(load_config_file(path), default_registry()).scheduler.profiles, r.name
    sessions = next(r for r in ROUTERS if r.name == "epp-precise-session")
    types = {p["type"] for p in yaml.safe_load((CONFIGS / sessions.epp_config).read_text())["plugins"]}
    assert {"session-affinity-scorer", PRECISE_TYPE} <= types
    assert sessions.parts == ("conversation",)


def test_a_full_run_repeats_only_the_judged_cells() -> None:
    """The EPP routers and the event-CPU baseline at the judged profile's top rate run five times
    (recorded as medians); the baselines, the other rates and the other profile run once."""
    by = {r.name: r for r in ROUTERS}
    judged = next(p for p in PROFILES if p.judged)
    other = next(p for p in PROFILES if not p.judged)
    top = max(judged.rates)
    assert runs_per_cell(FULL, judged, by["epp-precise"], top) == 5
    assert runs_per_cell(FULL, judged, by[NO_EVENTS], top) == 5
    assert runs_per_cell(FULL, judged, by["round-robin"], top) == 1
    assert runs_per_cell(FULL, judged, by["epp-precise"], 40.0) == 1
    assert runs_per_cell(FULL, other, by["epp-precise"], max(other.rates)) == 1
    assert runs_per_cell(replace(FULL, repeat=7), judged, by["round-robin"], top) == 7
