"""latency-scorer: GIE's headroom buckets and composite fallback (gie-inventory §4.5)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from epp.datalayer.attributes import (
    LATENCY_PREDICTION,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    LatencyPredictionInfo,
    PrefixMatchInfo,
)
from epp.plugin.state import CycleState
from epp.scheduling.scorers.latency import LatencyScorer
from epp.testing.clock import ManualClock
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def info(ttft_h: float, tpot_h: float, *, dispatched: int = 1, valid: bool = True) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(
        ttft_valid=valid,
        tpot_valid=valid,
        ttft_headroom=ttft_h,
        tpot_headroom=tpot_h,
        ttft=100.0 - ttft_h,
        tpot=10.0 - tpot_h,
        dispatched_request_count=dispatched,
    )


def score(scorer: LatencyScorer, infos: Sequence[LatencyPredictionInfo | None]) -> list[float]:
    eps = [endpoint(i) for i in range(len(infos))]
    state = CycleState()
    state.set_attributes(
        LATENCY_PREDICTION, {ep: i for ep, i in zip(eps, infos, strict=True) if i is not None}
    )
    return list(scorer.score(state, request(), eps))


def test_defaults() -> None:
    s = build(LatencyScorer)
    assert (s.alpha, s.beta) == pytest.approx((0.8, 0.2))
    assert s.strategy == "least"
    assert s.composite == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_positive_least_prefers_tightest_fit() -> None:
    """least: the smallest |headroom| gets w = 101 -> 1.0, the largest w = 1 -> 0.01; negatives 0."""
    s = build(LatencyScorer)
    # ttft headrooms 10, 30, 50 (tpot all 5: zero range -> weight moves to ttft), one negative
    out = score(s, [info(10, 5), info(30, 5), info(50, 5), info(-5, 5)])
    assert out == pytest.approx([1.0, 0.51, 0.01, 0.0])


def test_positive_most_prefers_largest_headroom() -> None:
    s = build(LatencyScorer, headroomSelectionStrategy="most")
    out = score(s, [info(10, 5), info(30, 5), info(50, 5)])
    assert out == pytest.approx([0.01, 0.51, 1.0])


def test_combined_weights() -> None:
    """combined = 0.8 nTTFT + 0.2 nTPOT; least: w = int((1 - combined) * 100) + 1."""
    s = build(LatencyScorer)
    out = score(s, [info(0, 10), info(100, 0)])
    # ep0: nTTFT 0, nTPOT 1 -> combined 0.2 -> w = 81; ep1: nTTFT 1, nTPOT 0 -> combined 0.8 ->
    # (1 - 0.8) * 100 = 19.999999999999996 in IEEE doubles (as in Go) -> int 19 -> w = 20
    assert out == pytest.approx([0.81, 0.20])


def test_all_ranges_zero_gives_half() -> None:
    s = build(LatencyScorer)
    assert score(s, [info(5, 5), info(5, 5)]) == pytest.approx([0.51, 0.51])


def test_missing_prediction_counts_as_positive() -> None:
    """An endpoint without a prediction joins the positive tier (headrooms 0)."""
    s = build(LatencyScorer)
    out = score(s, [info(20, 5), None, info(-1, -1)])
    assert out[2] == 0.0
    assert out[1] == pytest.approx(1.0)  # |0| is the tightest fit
    assert out[0] == pytest.approx(0.01)


def test_no_positive_prefers_idle() -> None:
    s = build(LatencyScorer)
    out = score(s, [info(-5, -5, dispatched=2), info(-50, -50, dispatched=0), info(-1, 1, dispatched=3)])
    assert out == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("strategy", ["least", "most"])
def test_no_positive_no_idle_best_bucket_least(strategy: str) -> None:
    """TPOT-only negatives first (TTFT met), scored with forced least; other buckets 0."""
    s = build(LatencyScorer, headroomSelectionStrategy=strategy)
    out = score(s, [info(10, -1), info(-5, 5), info(-5, -5), info(30, -1)])
    assert out == pytest.approx([1.0, 0.0, 0.0, 0.01])
    # no TPOT-only: the TTFT-only bucket; smallest violation wins
    out = score(s, [info(-10, 1), info(-40, 1), info(-5, -5)])
    assert out == pytest.approx([1.0, 0.01, 0.0])
    # only both-negative
    out = score(s, [info(-10, -1), info(-40, -1)])
    assert out == pytest.approx([1.0, 0.01])


def test_composite_fallback_without_predictions() -> None:
    """No valid prediction anywhere: round(100 * (kvFree + relQueue + prefix) / 3) / 100."""
    s = build(LatencyScorer)
    eps = [endpoint(0, queue=0, kv=0.5), endpoint(1, queue=10, kv=0.0), endpoint(2, queue=5, kv=1.0)]
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[2]: PrefixMatchInfo(4, 4, 16)})
    state.set_attributes(LATENCY_PREDICTION, {eps[0]: info(1, 1, valid=False)})
    out = s.score(state, request(), eps)
    assert out == pytest.approx([round(100 * (0.5 + 1.0) / 3) / 100, round(100 * 1.0 / 3) / 100, 0.5])


def test_composite_prefix_term_reads_the_engines_reported_prefix() -> None:
    """With a precise-prefix-cache-scorer's match present, the prefix term is what the engine
    holds, not the approximate guess."""
    s = build(LatencyScorer, compositeKVWeight=0, compositeQueueWeight=0, compositePrefixWeight=1)
    eps = [endpoint(0), endpoint(1)]
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[0]: PrefixMatchInfo(4, 4, 16)})
    assert s.score(state, request(), eps) == pytest.approx([1.0, 0.0])
    state.set_attributes(
        PRECISE_PREFIX_MATCH, {eps[0]: PrefixMatchInfo(0, 4, 16), eps[1]: PrefixMatchInfo(2, 4, 16)}
    )
    assert s.score(state, request(), eps) == pytest.approx([0.0, 0.5])


def test_composite_weights_non_positive_sum_means_kv_only() -> None:
    s = build(LatencyScorer, compositeKVWeight=0, compositeQueueWeight=0, compositePrefixWeight=0)
    eps = [endpoint(0, kv=0.25, queue=3)]
    assert s.score(CycleState(), request(), eps) == pytest.approx([0.75])


# --- best-effort routing (ours: bestEffortTTFTMs) -----------------------------------------------------
def no_slo(ttft: float, *, dispatched: int = 1, tpot: float = 10.0) -> LatencyPredictionInfo:
    """What the producer writes for a request without SLO headers: headroom = 0 - prediction."""
    return LatencyPredictionInfo(
        ttft_valid=True,
        tpot_valid=True,
        ttft_headroom=0.0 - ttft,
        tpot_headroom=0.0 - tpot,
        ttft=ttft,
        tpot=tpot,
        dispatched_request_count=dispatched,
    )


def test_best_effort_off_by_default_keeps_gie_behaviour() -> None:
    """Without the parameter a request with no SLO gets GIE's least violation: the fastest endpoint."""
    s = build(LatencyScorer, headroomSelectionStrategy="most")
    assert s.best_effort_ttft == 0.0
    out = score(s, [no_slo(100), no_slo(900), no_slo(3000)])
    assert out.index(max(out)) == 0


def with_slo_traffic(s: LatencyScorer) -> ManualClock:
    """The scorer sees one request with an SLO now; returns its (fake) clock."""
    clock = ManualClock()
    s.clock = clock
    score(s, [info(10, 5), info(30, 5)])
    return clock


def test_best_effort_keeps_the_fastest_endpoint_for_slo_traffic() -> None:
    """With SLO traffic about, the endpoint with the least work ahead is reserved and the request
    without an SLO takes the fastest of the others (GIE's choice among them)."""
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    with_slo_traffic(s)
    out = score(s, [no_slo(900), no_slo(100), no_slo(3000), no_slo(400)])
    assert out[1] == 0.0  # the reserve
    assert out[3] == pytest.approx(1.0)
    assert out[3] > out[0] > out[2]


def test_best_effort_may_take_the_reserve_within_the_slo_headroom() -> None:
    """Work that fits in the TTFT headroom the last SLO request had does not need to be kept off
    the reserve: it goes to the fastest endpoint, as GIE would send it."""
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    with_slo_traffic(s)  # its best endpoint had 30 ms of headroom
    assert score(s, [no_slo(900), no_slo(25), no_slo(400)]).index(1.0) == 1
    assert score(s, [no_slo(900), no_slo(35), no_slo(400)]).index(1.0) == 2


def test_a_tpot_only_slo_keeps_the_reserve_but_leaves_the_ttft_headroom() -> None:
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    with_slo_traffic(s)  # 30 ms of TTFT headroom
    tpot_only = LatencyPredictionInfo(True, True, -50.0, 5.0, 50.0, 10.0, 1)  # TTFT headroom = -prediction
    score(s, [tpot_only, tpot_only])
    assert s.slo_headroom == 30.0
    assert score(s, [no_slo(900), no_slo(25), no_slo(400)]).index(1.0) == 1


def test_best_effort_reserve_size() -> None:
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000, sloReserveEndpoints=2)
    with_slo_traffic(s)
    out = score(s, [no_slo(900), no_slo(100), no_slo(3000), no_slo(400)])
    assert out[1] == out[3] == 0.0
    assert out.index(max(out)) == 0


def test_best_effort_without_recent_slo_traffic_reserves_nothing() -> None:
    """No SLO request for longer than SLO_RECENT_S: GIE's choice over all endpoints (the fastest)."""
    from epp.scheduling.scorers.latency import SLO_RECENT_S

    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    fleet = [no_slo(900), no_slo(100), no_slo(3000), no_slo(400)]
    s.clock = ManualClock()
    assert score(s, fleet).index(1.0) == 1  # never seen one
    clock = with_slo_traffic(s)
    clock.now += SLO_RECENT_S / 2
    assert score(s, fleet)[1] == 0.0
    clock.now += SLO_RECENT_S
    assert score(s, fleet).index(1.0) == 1


def test_best_effort_uses_the_reserve_rather_than_wait_beyond_the_bound() -> None:
    """Work-conserving: when every other endpoint predicts a TTFT beyond bestEffortTTFTMs the
    request goes where GIE would send it (the fastest endpoint, i.e. the reserve)."""
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=500)
    with_slo_traffic(s)
    out = score(s, [no_slo(900), no_slo(100), no_slo(3000), no_slo(700)])
    assert out.index(max(out)) == 1


def test_best_effort_reserve_needs_another_endpoint() -> None:
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    with_slo_traffic(s)
    gie = build(LatencyScorer, headroomSelectionStrategy="most")
    assert score(s, [no_slo(900)]) == score(gie, [no_slo(900)])  # nothing to keep it from


def test_best_effort_packs_onto_the_busiest_endpoint_within_the_bound() -> None:
    s = build(
        LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000, bestEffortPlacement="pack"
    )
    out = score(s, [no_slo(100), no_slo(900), no_slo(3000), no_slo(1500)])
    # within 2000 ms: 100, 900, 1500; the least headroom (1500 ms predicted) is the best fit
    assert out[3] == pytest.approx(1.0)
    assert out[2] == 0.0  # beyond the bound
    assert out[3] > out[1] > out[0] > 0.0


def test_best_effort_beyond_the_bound_everywhere_falls_back_to_gie() -> None:
    s = build(
        LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=500, bestEffortPlacement="pack"
    )
    out = score(s, [no_slo(900), no_slo(700, dispatched=0), no_slo(3000)])
    assert out == [0.0, 1.0, 0.0]  # GIE: no positive endpoint, the idle one


def test_best_effort_does_not_touch_requests_with_an_slo() -> None:
    """A request with an SLO is scored by GIE's buckets (here most: the largest headroom)."""
    s = build(LatencyScorer, headroomSelectionStrategy="most", bestEffortTTFTMs=2000)
    out = score(s, [info(10, 5), info(30, 5), info(50, 5)])
    assert out == pytest.approx([0.01, 0.51, 1.0])


def test_best_effort_alias_and_validation() -> None:
    from pydantic import ValidationError

    from epp.scheduling.scorers.latency import LatencyScorerParams

    assert LatencyScorerParams.model_validate({"bestEffortTTFTMs": 250}).best_effort_ttft_ms == 250
    with pytest.raises(ValidationError):
        LatencyScorerParams.model_validate({"bestEffortTTFTMs": -1})
    with pytest.raises(ValidationError):
        LatencyScorerParams.model_validate({"sloReserveEndpoints": -1})
    with pytest.raises(ValidationError):
        LatencyScorerParams.model_validate({"bestEffortPlacement": "spread"})
