"""llm-d-router's control header names and GIE's, read as upstream's ``metadata`` package does
(vectors from its ``consts_test.go``), and what the director takes from each."""

from __future__ import annotations

from epp.director.latency.slo import slo_ms
from epp.request import (
    FAIRNESS_HEADER,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    SLO_TPOT_HEADER,
    SLO_TTFT_HEADER,
    control_header,
    header_names,
)


def test_header_names_current_first_then_alias() -> None:
    assert header_names(OBJECTIVE_HEADER) == ("x-llm-d-inference-objective", "x-gateway-inference-objective")
    assert header_names("X-LLM-D-Inference-Objective") == header_names(OBJECTIVE_HEADER)
    assert header_names(SLO_TTFT_HEADER) == ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
    assert header_names(SLO_TPOT_HEADER) == ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
    assert header_names(FAIRNESS_HEADER) == (
        "x-llm-d-inference-fairness-id",
        "x-gateway-inference-fairness-id",
    )
    assert header_names(MODEL_REWRITE_HEADER) == (
        "x-llm-d-model-name-rewrite",
        "x-gateway-model-name-rewrite",
    )
    assert header_names("x-gateway-destination-endpoint") == ("x-gateway-destination-endpoint",)
    assert header_names("X-User-Header") == ("x-user-header",)


def test_current_name_wins_then_alias_then_plain() -> None:
    both = {"x-gateway-inference-objective": "old-objective", OBJECTIVE_HEADER: "new-objective"}
    assert control_header(both, OBJECTIVE_HEADER) == "new-objective"
    assert (
        control_header({"x-gateway-inference-objective": "old-objective"}, OBJECTIVE_HEADER)
        == "old-objective"
    )
    assert control_header({"x-user-header": "user-value"}, "x-user-header") == "user-value"
    assert control_header({}, OBJECTIVE_HEADER) is None
    # Present wins even when empty, as upstream's map lookup: the alias is not consulted.
    assert (
        control_header({OBJECTIVE_HEADER: "", "x-gateway-inference-objective": "old"}, OBJECTIVE_HEADER) == ""
    )


def test_slo_headers_read_by_either_name() -> None:
    """The predictor producer and the latency-SLO admitter read the SLOs through ``slo_ms``."""
    assert slo_ms({"x-llm-d-slo-ttft-ms": "300"}, SLO_TTFT_HEADER) == 300.0
    assert slo_ms({"x-slo-tpot-ms": "40"}, SLO_TPOT_HEADER) == 40.0
    assert slo_ms({"x-llm-d-slo-tpot-ms": "20", "x-slo-tpot-ms": "40"}, SLO_TPOT_HEADER) == 20.0
