"""The scheduler and its profiles: filter order, weighted sums, handler rounds, errors, metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from epp.datalayer.api import Endpoint
from epp.metrics.series import REGISTRY
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import (
    PROFILE_TRACES,
    BoundedScorer,
    ProfileRunResult,
    SchedulerProfileView,
    SchedulingResult,
    Scorer,
    ScorerCategory,
)
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, SchedulingError
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.plugins import PluginClass, build
from tests.scheduling.builders import endpoint, request


class FixedScorer(PluginBase):
    """Returns the scores it was given."""

    TYPE: ClassVar[str] = "test-fixed-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE

    def __init__(self, name: str, scores: Sequence[float]) -> None:
        super().__init__(name, None, None)  # type: ignore[arg-type]
        self.scores = list(scores)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return self.scores[: len(endpoints)]


class DropFilter(PluginBase):
    """Drops the endpoints at the given indexes of the original list; records its calls."""

    TYPE: ClassVar[str] = "test-drop-filter"

    def __init__(self, name: str, drop: set[str], log: list[str]) -> None:
        super().__init__(name, None, None)  # type: ignore[arg-type]
        self.drop = drop
        self.log = log

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        self.log.append(self.typed_name.name)
        return [e for e in endpoints if e.metadata.pod_name not in self.drop]


class RecordingPicker(PluginBase):
    """Returns every endpoint, best first, and records the totals it saw."""

    TYPE: ClassVar[str] = "test-recording-picker"

    def __init__(self) -> None:
        super().__init__("rec", None, None)  # type: ignore[arg-type]
        self.seen: list[list[float]] = []

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        self.seen.append(list(scores))
        order = sorted(range(len(endpoints)), key=lambda i: -scores[i])
        return ProfileRunResult(tuple(endpoints[i] for i in order))


def _single(profile: SchedulerProfile) -> Scheduler:
    return Scheduler(build(SingleProfileHandler), [profile])


def test_weighted_sum_hermetic_case_1() -> None:
    """GIE hermetic #1: queue (0.7,1,0) + kv (0.8,0.9,0.8) + prefix 0 + lora 0 = (1.5,1.9,0.8) → pod-1."""
    eps = [endpoint(0, queue=3, kv=0.2), endpoint(1, queue=0, kv=0.1), endpoint(2, queue=10, kv=0.2)]
    picker = RecordingPicker()
    classes: tuple[PluginClass[Scorer], ...] = (
        QueueScorer,
        KVCacheUtilizationScorer,
        PrefixCacheScorer,
        LoraAffinityScorer,
    )
    scorers = [(build(c), 1.0) for c in classes]
    profile = SchedulerProfile("default", filters=[], scorers=scorers, picker=picker)
    result = _single(profile).schedule(CycleState(), request(model="my-model-12345"), eps)
    assert picker.seen[0] == pytest.approx([1.5, 1.9, 0.8])
    assert result.primary.target_endpoints[0] is eps[1]
    real = SchedulerProfile("default", filters=[], scorers=scorers, picker=build(MaxScorePicker))
    assert _single(real).schedule(CycleState(), request(), eps).primary.target_endpoints == (eps[1],)


def test_explain_keeps_every_candidates_total_and_the_same_pick() -> None:
    """``request.explain`` (--emit-endpoint-scores): the result lists each candidate with its total."""
    eps = [endpoint(0, queue=3, kv=0.2), endpoint(1, queue=0, kv=0.1), endpoint(2, queue=10, kv=0.2)]
    classes: tuple[PluginClass[Scorer], ...] = (QueueScorer, KVCacheUtilizationScorer)
    scorers = [(build(c), 1.0) for c in classes]
    profile = SchedulerProfile("default", filters=[], scorers=scorers, picker=build(MaxScorePicker))
    plain = _single(profile).schedule(CycleState(), request(), eps).primary
    assert plain.scored == ()
    req = request()
    req.explain = True
    explained = _single(profile).schedule(CycleState(), req, eps).primary
    assert explained.target_endpoints == plain.target_endpoints == (eps[1],)
    assert [ep for ep, _ in explained.scored] == eps
    assert [t for _, t in explained.scored] == pytest.approx([1.5, 1.9, 0.8])


@pytest.mark.parametrize(
    ("scorers", "expected"),
    [
        pytest.param([([0.5, 0.25], 2.0)], [1.0, 0.5], id="weights-are-raw-multipliers"),
        pytest.param([([1.0, 0.0], 3.0), ([0.0, 1.0], 1.0)], [3.0, 1.0], id="not-normalised"),
        pytest.param([([1.7, -0.3], 1.0)], [1.0, 0.0], id="clamped-to-unit-interval"),
        pytest.param([([float("nan"), 0.5], 1.0)], [0.0, 0.5], id="nan-counts-as-zero"),
        pytest.param([([float("inf"), float("-inf")], 2.0)], [2.0, 0.0], id="infinities-clamped"),
        pytest.param([], [0.0, 0.0], id="no-scorers-all-zero"),
        pytest.param([([0.1, 0.2], 1.0)] * 4, [0.4, 0.8], id="four-scorers"),
        pytest.param(
            [([0.1, 0.2], 1.0)] * 4 + [([1.0, 0.0], 0.5)], [0.9, 0.8], id="five-scorers-generic-path"
        ),
    ],
)
def test_weighted_sum(scorers: list[tuple[list[float], float]], expected: list[float]) -> None:
    """Totals start at 0 and add clamp(score, 0, 1) * weight per scorer."""
    picker = RecordingPicker()
    profile = SchedulerProfile(
        "p",
        filters=[],
        scorers=[(FixedScorer(f"s{i}", s), w) for i, (s, w) in enumerate(scorers)],
        picker=picker,
    )
    profile.run(CycleState(), request(), [endpoint(0), endpoint(1)])
    assert picker.seen[0] == pytest.approx(expected)


class BoundedFixedScorer(FixedScorer):
    """A fixed scorer that promises scores in [0, 1] (``BoundedScorer``), here falsely."""

    BOUNDED: ClassVar[bool] = True


def test_a_bounded_scorer_is_taken_at_its_word() -> None:
    """``BOUNDED = True`` skips the clamp (the promise is the scorer's); without it, the profile clamps."""
    assert isinstance(BoundedFixedScorer("b", []), BoundedScorer)
    assert not isinstance(FixedScorer("f", []), BoundedScorer)
    assert isinstance(build(QueueScorer), BoundedScorer)
    assert not isinstance(build(KVCacheUtilizationScorer), BoundedScorer)  # a scraped usage may exceed 1
    seen = []
    for cls in (BoundedFixedScorer, FixedScorer):
        picker = RecordingPicker()
        profile = SchedulerProfile("p", filters=[], scorers=[(cls("s", [1.5, -0.5]), 2.0)], picker=picker)
        profile.run(CycleState(), request(), [endpoint(0), endpoint(1)])
        seen.append(picker.seen[0])
    assert seen == [[3.0, -1.0], [2.0, 0.0]]


def test_filters_run_in_order_and_stop_at_empty() -> None:
    """Filters run in config order on the survivors; an empty list stops the chain with GIE's error."""
    calls: list[str] = []
    eps = [endpoint(0), endpoint(1), endpoint(2)]
    picker = RecordingPicker()
    keep_two = SchedulerProfile(
        "p",
        filters=[DropFilter("f1", {"pod-0"}, calls), DropFilter("f2", {"pod-2"}, calls)],
        scorers=[],
        picker=picker,
    )
    assert keep_two.run(CycleState(), request(), eps).target_endpoints == (eps[1],)
    assert calls == ["f1", "f2"]

    calls.clear()
    empty = SchedulerProfile(
        "p",
        filters=[DropFilter("f1", {"pod-0", "pod-1", "pod-2"}, calls), DropFilter("f2", set(), calls)],
        scorers=[],
        picker=picker,
    )
    with pytest.raises(SchedulingError, match=r"^no endpoints available for the given request$"):
        empty.run(CycleState(), request(), eps)
    assert calls == ["f1"]


def test_single_profile_failure_message() -> None:
    """A profile whose filters drop everything surfaces as GIE's handler error."""
    profile = SchedulerProfile(
        "default", filters=[DropFilter("f", {"pod-0"}, [])], scorers=[], picker=build(MaxScorePicker)
    )
    with pytest.raises(SchedulingError, match=r"^failed to run scheduler profile 'default'$"):
        _single(profile).schedule(CycleState(), request(), [endpoint(0)])


class TwoRoundHandler(PluginBase):
    """Round 1 runs ``decode``, round 2 ``prefill``; the decode result is primary."""

    TYPE: ClassVar[str] = "test-two-round-handler"

    def __init__(self, *, first: Sequence[str] = ("decode",)) -> None:
        super().__init__("two", None, None)  # type: ignore[arg-type]
        self.rounds: list[list[str]] = []
        self.first = list(first)

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        self.rounds.append(sorted(results))
        if not results:
            return self.first
        if "prefill" not in results:
            return ["prefill"]
        return []

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        return SchedulingResult(profile_results=dict(results), primary_profile_name="decode")


def test_multi_profile_rounds() -> None:
    """The handler sees earlier results each round; a failing profile is stored as None."""
    eps = [endpoint(0), endpoint(1)]
    handler = TwoRoundHandler()
    decode = SchedulerProfile(
        "decode", filters=[], scorers=[(FixedScorer("s", [0.1, 0.9]), 1.0)], picker=build(MaxScorePicker)
    )
    prefill = SchedulerProfile(
        "prefill", filters=[DropFilter("f", {"pod-0", "pod-1"}, [])], scorers=[], picker=build(MaxScorePicker)
    )
    result = Scheduler(handler, [decode, prefill]).schedule(CycleState(), request(), eps)
    assert handler.rounds == [[], ["decode"], ["decode", "prefill"]]
    assert result.primary.target_endpoints == (eps[1],)
    assert result.profile_results["prefill"] is None


def test_explained_multi_profile_request_keeps_a_trace_per_run() -> None:
    """P/D-shaped: the decode run's filters, weighted scores and pick, and the prefill run that
    its filter emptied, both in the cycle state in run order."""
    eps = [endpoint(0), endpoint(1)]
    decode = SchedulerProfile(
        "decode", filters=[], scorers=[(FixedScorer("s", [0.1, 0.9]), 2.0)], picker=build(MaxScorePicker)
    )
    prefill = SchedulerProfile(
        "prefill", filters=[DropFilter("f", {"pod-0", "pod-1"}, [])], scorers=[], picker=build(MaxScorePicker)
    )
    req = request()
    req.explain = True
    state = CycleState()
    result = Scheduler(TwoRoundHandler(), [decode, prefill]).schedule(state, req, eps)
    d, p = state.get(PROFILE_TRACES) or []
    assert (d.profile, d.scorers, d.scored, d.picked) == ("decode", (("s", 2.0),), tuple(eps), (eps[1],))
    assert d.contributions == ([0.2, 1.8],) and tuple(d.totals) == (0.2, 1.8)
    assert result.primary.scored == ((eps[0], 0.2), (eps[1], 1.8))
    assert (p.profile, p.filters, p.error) == (
        "prefill",
        (("f", ()),),
        "no endpoints available for the given request",
    )


@pytest.mark.parametrize(
    ("first", "message"),
    [
        pytest.param(
            [], "^failed to run any scheduler profile for request test-request-id$", id="nothing-picked"
        ),
        pytest.param(
            ["nope"], "^profile handler picked unknown scheduling profile 'nope'$", id="unknown-profile"
        ),
    ],
)
def test_handler_errors(first: list[str], message: str) -> None:
    """An empty first pick and an unknown profile name fail the attempt."""
    profile = SchedulerProfile("decode", filters=[], scorers=[], picker=build(MaxScorePicker))
    with pytest.raises(SchedulingError, match=message):
        Scheduler(TwoRoundHandler(first=first), [profile]).schedule(CycleState(), request(), [endpoint(0)])


def test_plugin_exception_fails_the_profile_only() -> None:
    """A scorer that raises makes its profile fail (None), not the process."""

    class Boom(FixedScorer):
        def score(self, *_: Any) -> Sequence[float]:
            raise RuntimeError("boom")

    profile = SchedulerProfile(
        "default", filters=[], scorers=[(Boom("b", []), 1.0)], picker=build(MaxScorePicker)
    )
    with pytest.raises(SchedulingError, match="failed to run scheduler profile 'default'"):
        _single(profile).schedule(CycleState(), request(), [endpoint(0)])


def test_scorer_length_mismatch_fails_profile() -> None:
    """Scores must align with the endpoints."""
    profile = SchedulerProfile(
        "default", filters=[], scorers=[(FixedScorer("s", [0.5]), 1.0)], picker=build(MaxScorePicker)
    )
    with pytest.raises(SchedulingError):
        _single(profile).schedule(CycleState(), request(), [endpoint(0), endpoint(1)])


def test_construction_errors() -> None:
    """NaN weights and duplicate profile names are rejected when the scheduler is built."""
    with pytest.raises(ValueError, match="without a weight"):
        SchedulerProfile(
            "p", filters=[], scorers=[(FixedScorer("s", []), float("nan"))], picker=build(MaxScorePicker)
        )
    p = SchedulerProfile("p", filters=[], scorers=[], picker=build(MaxScorePicker))
    with pytest.raises(ValueError, match="duplicate scheduling profile name 'p'"):
        Scheduler(build(SingleProfileHandler), [p, p])


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_recorded() -> None:
    """Attempts (success with the primary's pod labels, failure with empty ones), e2e and plugin durations."""
    eps = [endpoint(7)]
    picker = build(MaxScorePicker, name="metrics-picker")
    scorer = FixedScorer("metrics-scorer", [1.0])
    ok = _single(SchedulerProfile("default", filters=[], scorers=[(scorer, 1.0)], picker=picker))
    success = {
        "status": "success",
        "target_model_name": "m-metrics",
        "pod_name": "pod-7",
        "namespace": "default",
        "port": "8000",
    }
    failure = {
        "status": "failure",
        "target_model_name": "m-metrics",
        "pod_name": "",
        "namespace": "",
        "port": "",
    }
    scorer_labels = {
        "extension_point": "Scorer",
        "plugin_type": "test-fixed-scorer",
        "plugin_name": "metrics-scorer",
    }
    picker_labels = {
        "extension_point": "Picker",
        "plugin_type": "max-score-picker",
        "plugin_name": "metrics-picker",
    }
    before = (
        _sample("inference_extension_scheduler_attempts_total", success),
        _sample("inference_extension_scheduler_attempts_total", failure),
        _sample("inference_extension_scheduler_e2e_duration_seconds_count", {}),
        _sample("inference_extension_plugin_duration_seconds_count", scorer_labels),
        _sample("inference_extension_plugin_duration_seconds_count", picker_labels),
    )
    ok.schedule(CycleState(), request(model="m-metrics"), eps)
    bad = _single(
        SchedulerProfile("default", filters=[DropFilter("f", {"pod-7"}, [])], scorers=[], picker=picker)
    )
    with pytest.raises(SchedulingError):
        bad.schedule(CycleState(), request(model="m-metrics"), eps)
    after = (
        _sample("inference_extension_scheduler_attempts_total", success),
        _sample("inference_extension_scheduler_attempts_total", failure),
        _sample("inference_extension_scheduler_e2e_duration_seconds_count", {}),
        _sample("inference_extension_plugin_duration_seconds_count", scorer_labels),
        _sample("inference_extension_plugin_duration_seconds_count", picker_labels),
    )
    assert [a - b for a, b in zip(after, before, strict=False)] == [1, 1, 2, 1, 1]
    handler_labels = {
        "extension_point": "ProfilePicker",
        "plugin_type": "single-profile-handler",
        "plugin_name": "single-profile-handler",
    }
    assert _sample("inference_extension_plugin_duration_seconds_count", handler_labels) >= 4


def test_kv_scorer_out_of_range_is_clamped() -> None:
    """A scraped KV usage above 1 (score below 0) is clamped by the profile: kv-cache is not BOUNDED."""
    picker = RecordingPicker()
    profile = SchedulerProfile(
        "p", filters=[], scorers=[(build(KVCacheUtilizationScorer), 1.0)], picker=picker
    )
    profile.run(CycleState(), request(), [endpoint(0, kv=1.3), endpoint(1, kv=-0.5), endpoint(2, kv=0.25)])
    assert picker.seen[0] == pytest.approx([0.0, 1.0, 0.75])
