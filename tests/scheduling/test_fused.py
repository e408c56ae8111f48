"""The fused plan (epp.scheduling.fused) against the general path, on generated traffic.

Two schedulers over the same fleet, scorers and weights, pickers seeded alike: one compiled
(``FusedPlan``), one kept on the general path (``fused=False``).  Request by request (samples
stored between requests, candidate lists that change, request-dependent attributes, an
unbounded scorer whose scores need clamping) they must pick the same endpoints, fail with the
same message, and the plan's totals must be bit-identical to the general path's explained
totals (a third profile, so explaining draws nothing from the compared pickers' RNGs).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.director.traced import traced_scheduler
from epp.plugin.state import CycleState
from epp.scheduling import fused as fused_module
from epp.scheduling import kernel
from epp.scheduling.api import PROFILE_TRACES, Picker
from epp.scheduling.fused import FusedPlan
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.weighted_random import WeightedRandomPicker
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, SchedulingError
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.testing.plugins import build
from tests.scheduling.builders import DropFilter, Recording, request
from tests.scheduling.vectors import MODELS, WildScorer, _endpoint, _scorers, _state, churn

ROOT = Path(__file__).parents[2]
SEEDS = 150
REQUESTS = 30


def _shapes(rng: random.Random) -> list[tuple[Any, float]]:
    """Random scorer lists, and now and then the shipped configs' shapes (default, prefix-heavy)."""
    r = rng.random()
    if r < 0.15:  # config/default.yaml: two cached scorers, then prefix accumulating into them
        return [
            (build(QueueScorer), 2.0),
            (build(KVCacheUtilizationScorer), 2.0),
            (build(PrefixCacheScorer), 3.0),
        ]
    if r < 0.3:  # prefix-heavy: prefix first, cached lists after it, then per-request lists
        return [
            (build(PrefixCacheScorer), 4.0),
            (build(QueueScorer), 1.0),
            (build(KVCacheUtilizationScorer), 1.0),
            (build(TokenLoadScorer, queueThresholdTokens=60000), 2.0),
            (WildScorer(), 2.0),
        ]
    if r < 0.4:  # two accumulating scorers with lists between and after them
        return [
            (build(QueueScorer), 1.0),
            (build(PrefixCacheScorer), 2.0),
            (WildScorer(), 0.5),
            (build(PrefixCacheScorer, "prefix-b"), 3.0),
            (build(KVCacheUtilizationScorer), 1.5),
        ]
    return _scorers(rng)


def _picker(kind: int, k: int, seed: int) -> Picker:
    picker: MaxScorePicker | WeightedRandomPicker
    if kind == 0:
        picker = build(MaxScorePicker, maxNumOfEndpoints=k)
    else:
        picker = build(WeightedRandomPicker, maxNumOfEndpoints=k)
    picker.rng = random.Random(seed)
    return picker


def _names(eps: Sequence[Endpoint]) -> list[str]:
    return [ep.metadata.pod_name for ep in eps]


def _outcome(scheduler: Scheduler, state: Any, req: Any, candidates: Sequence[Endpoint]) -> Any:
    try:
        return _names(scheduler.schedule(state, req, candidates).primary.target_endpoints)
    except SchedulingError as e:
        return ("error", str(e))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fused_plan_picks_and_scores_exactly_like_the_general_path(seed: int) -> None:
    rng = random.Random(seed)
    hi = rng.choice((0, 3, 50))
    fleet = [_endpoint(rng, i, hi) for i in range(rng.choice((1, 2, 3, 10, 40, 120)))]
    scorers = _shapes(rng)
    kind = 0 if rng.random() < 0.75 else 1
    k = rng.choice((1, 1, 1, 2, 5))
    general = Scheduler(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=scorers, picker=_picker(kind, k, seed))],
        fused=False,
    )
    fused = Scheduler(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=scorers, picker=_picker(kind, k, seed))],
    )
    explained = SchedulerProfile("p", filters=[], scorers=scorers, picker=Recording(_picker(kind, k, seed)))
    assert general.fused is None
    plan = fused.fused
    assert plan is not None
    candidates: Sequence[Endpoint] = tuple(fleet)
    for r in range(REQUESTS):
        candidates = churn(rng, fleet, candidates, hi, empty=True)
        state = _state(rng, candidates)
        model = rng.choice(MODELS)
        req = request(model=model, request_id=f"r{seed}-{r}")
        want = _outcome(general, state, req, candidates)
        got = _outcome(fused, state, req, candidates)
        assert got == want, f"seed {seed}, request {r}: picks differ"
        if not candidates:
            assert got == ("error", "failed to run scheduler profile 'p'")
            continue
        totals = plan.totals(state, req, candidates)
        ask = request(model=model, request_id=f"r{seed}-{r}")
        ask.explain = True
        scored = explained.run(state, ask, candidates).scored
        assert [t.hex() for t in totals] == [t.hex() for _, t in scored], f"seed {seed}, request {r}"


def test_an_explained_request_takes_the_general_path_and_keeps_its_breakdown() -> None:
    fleet = tuple(_endpoint(random.Random(1), i, 3) for i in range(4))
    scheduler = Scheduler(
        build(SingleProfileHandler),
        [
            SchedulerProfile(
                "p",
                filters=[],
                scorers=[(build(QueueScorer), 2.0), (build(PrefixCacheScorer), 3.0)],
                picker=build(MaxScorePicker),
            )
        ],
    )
    assert scheduler.fused is not None
    state = _state(random.Random(2), fleet)
    req = request(request_id="explained")
    req.explain = True
    result = scheduler.schedule(state, req, fleet)
    assert len(result.primary.scored) == 4
    (trace,) = state.get(PROFILE_TRACES) or []
    assert [name for name, _ in trace.scorers] == ["queue-scorer", "prefix-cache-scorer"]
    assert len(trace.contributions) == 2


def test_unusual_shapes_take_the_general_path() -> None:
    def profile(name: str = "p", filters: Sequence[Any] = ()) -> SchedulerProfile:
        return SchedulerProfile(
            name, filters=filters, scorers=[(build(QueueScorer), 1.0)], picker=build(MaxScorePicker)
        )

    single = build(SingleProfileHandler)
    assert FusedPlan.compile(single, [profile()]) is not None
    assert FusedPlan.compile(single, [profile(filters=[DropFilter(frozenset())])]) is None
    assert FusedPlan.compile(single, [profile("a"), profile("b")]) is None
    traced = traced_scheduler(Scheduler(single, [profile()]))
    assert isinstance(traced, Scheduler)
    assert traced.fused is None  # sampled requests: a span per profile run


@pytest.mark.parametrize(
    "config",
    ["config/default.yaml", "bench/configs/prefix-heavy.yaml", "config/examples/prefix-and-load.yaml"],
)
def test_the_shipped_common_configs_compile_a_fused_plan(config: str) -> None:
    c = build_components(load_config((ROOT / config).read_text()), default_registry())
    assert isinstance(c.scheduler, Scheduler)
    assert c.scheduler.fused is not None


def test_a_pd_config_takes_the_general_path() -> None:
    c = build_components(load_config((ROOT / "bench/configs/pd-prefix.yaml").read_text()), default_registry())
    assert isinstance(c.scheduler, Scheduler)
    assert c.scheduler.fused is None


def test_a_picker_rng_replaced_after_building_breaks_the_fused_plans_ties() -> None:
    """Tests seed ``picker.rng`` after the scheduler is built: the inlined max-score pick reads it."""
    fleet = tuple(_endpoint(random.Random(3), i, 0) for i in range(8))  # all idle: every total ties
    picker = build(MaxScorePicker)
    scheduler = Scheduler(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=[(build(QueueScorer), 1.0)], picker=picker)],
    )
    assert scheduler.fused is not None

    def picks(seed: int) -> list[list[str]]:
        picker.rng = random.Random(seed)
        return [
            _names(
                scheduler.schedule(_state(random.Random(0), fleet), request(), fleet).primary.target_endpoints
            )
            for _ in range(12)
        ]

    assert picks(5) == picks(5)
    assert picks(5) != picks(6)


def test_the_verdict_for_an_endpoint_is_made_once_and_equals_the_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan keeps one verdict per picked endpoint (equal to the handler's, per request it
    would make a new one), and starts its table again once it holds ``VERDICTS_MAX``."""
    monkeypatch.setattr(fused_module, "VERDICTS_MAX", 2)
    fleet = tuple(_endpoint(random.Random(4), i, 0) for i in range(3))

    def scheduler(fused: bool) -> Scheduler:
        scorer = build(QueueScorer)
        return Scheduler(
            build(SingleProfileHandler),
            [SchedulerProfile("p", filters=[], scorers=[(scorer, 1.0)], picker=build(MaxScorePicker))],
            fused=fused,
        )

    plan_side, general = scheduler(True), scheduler(False)
    seen = []
    for i in (0, 0, 1, 2, 0):  # the candidates narrowed to one endpoint: it is the pick
        only = (fleet[i],)
        got = plan_side.schedule(CycleState(), request(), only)
        assert got == general.schedule(CycleState(), request(), only)
        assert got.primary.target_endpoints == only
        seen.append(got)
    assert seen[1] is seen[0]  # kept, not made again
    assert seen[4] is not seen[0]  # three endpoints picked, two kept: the table started again
    assert seen[4] == seen[0]


# --- the scoring in C (epp.scheduling.kernel) ---------------------------------------------------


def _prefix_heavy_scorers() -> list[tuple[Any, float]]:
    """bench/configs/prefix-heavy.yaml's profile, with a backlog on some endpoints."""
    prefill = build(PrefillLoadScorer)
    prefill._backlog.update({"ns/pod-1": 300, "ns/pod-3": 40})
    return [
        (build(PrefixCacheScorer), 4.0),
        (build(QueueScorer), 1.0),
        (build(KVCacheUtilizationScorer), 1.0),
        (build(TokenLoadScorer, queueThresholdTokens=60000), 2.0),
        (prefill, 2.0),
    ]


def test_the_prefix_heavy_profile_takes_the_kernel() -> None:
    c = build_components(
        load_config((ROOT / "bench/configs/prefix-heavy.yaml").read_text()), default_registry()
    )
    assert isinstance(c.scheduler, Scheduler)
    assert c.scheduler.fused is not None
    assert c.scheduler.fused.implementation == kernel.IMPLEMENTATION  # "c" unless EPP_PURE_PYTHON=1
    plan = FusedPlan.compile(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=_prefix_heavy_scorers(), picker=build(MaxScorePicker))],
    )
    assert plan is not None
    assert plan.implementation == kernel.IMPLEMENTATION


@pytest.mark.parametrize("seed", range(20))
def test_the_kernel_plan_picks_and_scores_exactly_like_the_general_path(seed: int) -> None:
    """The prefix-heavy profile (prefill-load included, which the generated shapes above leave
    out): the kernel's plan against the general path, picks and bits of the totals."""
    rng = random.Random(seed)
    fleet = [_endpoint(rng, i, rng.choice((0, 3, 50))) for i in range(rng.choice((1, 2, 4, 10)))]
    scorers = _prefix_heavy_scorers()
    general = Scheduler(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=scorers, picker=_picker(0, 1, seed))],
        fused=False,
    )
    fused = Scheduler(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=scorers, picker=_picker(0, 1, seed))],
    )
    explained = SchedulerProfile("p", filters=[], scorers=scorers, picker=Recording(_picker(0, 1, seed)))
    plan = fused.fused
    assert plan is not None
    assert plan.implementation == kernel.IMPLEMENTATION
    candidates: Sequence[Endpoint] = tuple(fleet)
    for r in range(REQUESTS):
        candidates = churn(rng, fleet, candidates, 3)
        state = _state(rng, candidates)
        req = request(request_id=f"k{seed}-{r}")
        req.prompt_token_count = rng.choice((0, 16, 64, 500))
        assert _outcome(fused, state, req, candidates) == _outcome(general, state, req, candidates)
        totals = plan.totals(state, req, candidates)
        ask = request(request_id=f"k{seed}-{r}")
        ask.prompt_token_count = req.prompt_token_count
        ask.explain = True
        scored = explained.run(state, ask, candidates).scored
        assert [t.hex() for t in totals] == [t.hex() for _, t in scored], f"seed {seed}, request {r}"


def test_a_scorer_the_kernel_does_not_compute_keeps_the_python_path() -> None:
    def implementation(scorers: list[tuple[Any, float]]) -> str:
        plan = FusedPlan.compile(
            build(SingleProfileHandler),
            [SchedulerProfile("p", filters=[], scorers=scorers, picker=build(MaxScorePicker))],
        )
        assert plan is not None
        return plan.implementation

    assert implementation(_prefix_heavy_scorers()) == kernel.IMPLEMENTATION
    assert implementation([*_prefix_heavy_scorers(), (WildScorer(), 1.0)]) == "python"
    assert implementation([(build(PrefixCacheScorer, matchLengthWeight=0.5), 1.0)]) == "python"
    assert (
        implementation([(build(QueueScorer), 1.0), (build(PrefixCacheScorer), 2.0)]) == kernel.IMPLEMENTATION
    )


def test_each_scorer_the_kernel_runs_is_observed_once_a_request_with_its_share() -> None:
    if kernel.Plan is None:
        pytest.skip(f"the C kernel is not in use: {kernel.REASON}")
    plan = FusedPlan.compile(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=_prefix_heavy_scorers(), picker=build(MaxScorePicker))],
    )
    assert plan is not None
    hists = plan._kernel_hists
    assert len(hists) == 3  # prefix, token-load, prefill-load: the cached two are the cache's
    seen: list[list[float]] = [[] for _ in hists]
    saved = [h.observe for h in hists]
    try:
        for h, got in zip(hists, seen, strict=True):
            h.observe = got.append
        fleet = tuple(_endpoint(random.Random(7), i, 3) for i in range(4))
        plan.totals(_state(random.Random(8), fleet), request(), fleet)
    finally:
        for h, observe in zip(hists, saved, strict=True):
            h.observe = observe
    assert [len(s) for s in seen] == [1, 1, 1]
    assert seen[0] == seen[1] == seen[2]  # one clock reading shared out


def test_an_input_the_kernel_cannot_compute_exactly_takes_the_python_path_for_that_request() -> None:
    """Prefix blocks beyond 2**53: the kernel declines (None) and the plan's Python path scores
    the request, with the general path's floats."""
    scorers = _prefix_heavy_scorers()
    plan = FusedPlan.compile(
        build(SingleProfileHandler),
        [SchedulerProfile("p", filters=[], scorers=scorers, picker=build(MaxScorePicker))],
    )
    explained = SchedulerProfile("p", filters=[], scorers=scorers, picker=Recording(build(MaxScorePicker)))
    assert plan is not None
    fleet = tuple(_endpoint(random.Random(9), i, 3) for i in range(3))
    for blocks in (4, 2**60 + 1):
        state = CycleState()
        state.set_attributes(PREFIX_MATCH, {fleet[1]: PrefixMatchInfo(blocks - 1, blocks, 16)})
        req = request()
        req.prompt_token_count = 100
        if plan._kernel is not None:  # the kernel declines the huge match only
            cached = [None, [0.5] * 3, [0.5] * 3]
            kernel_says = plan._kernel.totals(
                fleet, None, cached, state.attributes(PREFIX_MATCH), {}, {}, {}, 100
            )
            assert (kernel_says is None) == (blocks > 2**53)
        totals = plan.totals(state, req, fleet)
        ask = request()
        ask.prompt_token_count = 100
        ask.explain = True
        scored = explained.run(state, ask, fleet).scored
        assert [t.hex() for t in totals] == [t.hex() for _, t in scored]


def test_compiling_a_plan_says_which_computes_its_scoring() -> None:
    """One log line per compiled plan: the kernel, or Python and why (a warning when not built)."""
    profiles = {
        "covered": _prefix_heavy_scorers(),
        "uncovered": [*_prefix_heavy_scorers(), (WildScorer(), 1.0)],
    }
    with capture_logs() as logs:
        for name, scorers in profiles.items():
            FusedPlan.compile(
                build(SingleProfileHandler),
                [SchedulerProfile(name, filters=[], scorers=scorers, picker=build(MaxScorePicker))],
            )
    said = {e["profile"]: e for e in logs if e["event"] == "scheduling_kernel"}
    assert said["covered"]["implementation"] == kernel.IMPLEMENTATION
    assert said["uncovered"]["implementation"] == "python"
    assert said["uncovered"]["reason"]
    if kernel.NATIVE is None:
        assert said["covered"]["log_level"] == "warning"
