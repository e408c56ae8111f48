"""The routing comparison's reductions: inference-perf's summary, ratios to round robin, goals."""

from __future__ import annotations

from typing import Any

import pytest

from bench.routing import derive, reduce_iperf


def test_reduce_iperf() -> None:
    """Seconds become milliseconds, "median" is p50, and failures count against the success rate."""
    data = {
        "successes": {
            "count": 9,
            "latency": {
                "time_to_first_token": {"median": 0.1, "p90": 0.25, "p99": 0.5},
                "inter_token_latency": {"median": 0.01, "p90": 0.02, "p99": 0.03},
                "request_latency": {"median": 1.0, "p90": 2.0},
            },
            "throughput": {"output_tokens_per_sec": 123.45, "requests_per_sec": 2.0},
        },
        "failures": {"count": 1},
    }
    r = reduce_iperf(data, wall=10.0)
    assert r["ttft_ms"] == {"p50": 100.0, "p90": 250.0, "p99": 500.0}
    assert r["itl_ms"]["p50"] == 10.0
    assert r["success_rate"] == 0.9
    assert r["errors"] == {"failed": 1}
    assert r["output_tokens_per_s"] == 123.5


def _cell(router: str, rate: float, p90: float, tput: float) -> dict[str, Any]:
    return {"router": router, "rate": rate, "ttft_ms": {"p90": p90}, "output_tokens_per_s": tput}


@pytest.mark.parametrize(
    ("epp_p90", "epp_tput", "vs_rr", "met_ttft", "met_tput", "met_peer"),
    [
        pytest.param(90.0, 2000.0, 0.09, True, True, True, id="all-goals-met"),
        pytest.param(500.0, 1500.0, 0.5, False, False, False, id="all-goals-missed"),
    ],
)
def test_derive_goals(
    epp_p90: float, epp_tput: float, vs_rr: float, met_ttft: bool, met_tput: bool, met_peer: bool
) -> None:
    """Ratios are taken at the top rate against round robin and the best peer; throughput at the peak."""
    cells = [
        _cell("round-robin", 8, 100.0, 900.0),
        _cell("round-robin", 16, 1000.0, 1000.0),
        _cell("vllm-cache-aware", 16, 150.0, 1900.0),
        _cell("sglang-cache-aware", 16, 200.0, 1800.0),
        _cell("epp-default", 8, 50.0, 900.0),
        _cell("epp-default", 16, epp_p90, epp_tput),
    ]
    d = derive(cells, ["epp-default", "round-robin", "vllm-cache-aware", "sglang-cache-aware"])
    g = d["goals"]["epp-default"]
    assert g["at_rate"] == 16
    assert g["ttft_p90_vs_rr"]["value"] == vs_rr
    assert g["ttft_p90_vs_rr"]["met"] is met_ttft
    assert g["peak_throughput_vs_rr"]["met"] is met_tput
    assert g["ttft_p90_vs_best_peer"]["value"] == round(epp_p90 / 150.0, 3)
    assert g["ttft_p90_vs_best_peer"]["met"] is met_peer
    assert d["peak_output_tokens_per_s"]["round-robin"] == 1000.0
