"""Differential test: the scheduling fast paths against the frozen reference (tests/scheduling/reference.py).

Generated fleets (1-300 endpoints, random metrics with zeros, equal values, ties, out-of-range
and NaN KV readings, LoRA adapters, prefix matches, in-flight loads), random scorer lists and
weights, filters and ``maxNumOfEndpoints``, run for several rounds in which some endpoints'
metrics are replaced (new readings, equal copies, or untouched) and the candidate list
changes.  Each round must give the same totals (bit for bit) and, with pickers seeded alike,
the same picks.  Rounds are what exercise the profile's metrics snapshot and its invalidation.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.datalayer.attributes import INFLIGHT_LOAD, PREFIX_MATCH, InFlightLoad, PrefixMatchInfo
from epp.plugin.state import CycleState
from epp.scheduling.api import PROFILE_TRACES, IncrementalMetricsScorer, ProfileRunResult, Scorer
from epp.scheduling.filters.prefix_affinity import PrefixCacheAffinityFilter
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.scheduler import SchedulerProfile, SchedulingError
from epp.scheduling.score_cache import MetricsScoreCache
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsSizeScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.testing.plugins import PluginClass, build
from tests.scheduling import reference as ref
from tests.scheduling.builders import DropFilter, Recording, request

MODELS = ("base", "lora-a", "lora-b", "lora-c")
SCORER_TYPES = (
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "running-requests-size-scorer",
    "prefix-cache-scorer",
    "lora-affinity-scorer",
    "token-load-scorer",
)
_CLASSES: dict[str, Any] = {
    "queue-scorer": QueueScorer,
    "kv-cache-utilization-scorer": KVCacheUtilizationScorer,
    "running-requests-size-scorer": RunningRequestsSizeScorer,
    "prefix-cache-scorer": PrefixCacheScorer,
    "lora-affinity-scorer": LoraAffinityScorer,
    "token-load-scorer": TokenLoadScorer,
}


class _IncrementalScorer(Scorer, IncrementalMetricsScorer, Protocol):
    """A scorer with both the per-request and the incremental metrics path."""


# --- generators -------------------------------------------------------------------------------
kv_values = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 0.25]),
    st.floats(0.0, 1.0),
    st.floats(-0.5, 1.5),
    st.just(math.nan),
)


@st.composite
def metrics(draw: st.DrawFn, queue_hi: int) -> Metrics:
    return Metrics(
        waiting_queue_size=draw(st.integers(0, queue_hi)),
        running_requests_size=draw(st.integers(0, queue_hi)),
        kv_cache_usage_percent=draw(kv_values),
        active_models=frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=2))),
        waiting_models=frozenset(draw(st.lists(st.sampled_from(MODELS), max_size=2))),
        max_active_models=draw(st.integers(0, 3)),
        update_time=draw(st.floats(0.0, 1e6)),
    )


@st.composite
def fleets(draw: st.DrawFn) -> list[Endpoint]:
    n = draw(st.one_of(st.integers(1, 12), st.integers(1, 300)))
    queue_hi = draw(st.sampled_from([0, 1, 3, 50]))  # 0: all equal; small: many ties
    shared = draw(metrics(queue_hi))
    out = []
    for i in range(n):
        m = shared if draw(st.integers(0, 9)) == 0 else draw(metrics(queue_hi))
        md = EndpointMetadata(name=f"ns/pod-{i}-rank-0", address=f"10.0.{i // 256}.{i % 256}", port=8000)
        out.append(Endpoint(replace(md, pod_name=str(i)), m))
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    eps = draw(fleets())
    types = draw(st.lists(st.sampled_from(SCORER_TYPES), min_size=0, max_size=6))
    weights = draw(
        st.lists(
            st.one_of(st.integers(0, 5).map(float), st.floats(-2.0, 10.0)),
            min_size=len(types),
            max_size=len(types),
        )
    )
    return {
        "endpoints": eps,
        "scorers": list(zip(types, weights, strict=True)),
        "k": draw(st.sampled_from([1, 1, 2, 3, 7])),
        "filter": draw(st.sampled_from(["none", "drop", "affinity"])),
        "threshold": draw(st.sampled_from([0.0, 0.5, 0.8])),
        "cap": draw(st.sampled_from([0, 10, 1000])),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "rounds": draw(st.integers(1, 4)),
        "churn": draw(st.sampled_from([0.05, 0.2, 1.0, 4.0])),
    }


def _round_state(rng: random.Random, eps: Sequence[Endpoint]) -> CycleState:
    """Random PREFIX_MATCH (shared no-match object, matches, zero totals, gaps) and INFLIGHT_LOAD."""
    state = CycleState()
    if rng.random() < 0.85:
        total = rng.choice([0, 1, 4, 16])
        none = PrefixMatchInfo(0, total, 16)
        infos: dict[Any, PrefixMatchInfo] = {}
        for ep in eps:
            r = rng.random()
            if r < 0.1:
                continue  # no entry: scores 0
            infos[ep] = none if r < 0.6 else PrefixMatchInfo(rng.randint(0, total), total, 16)
        state.set_attributes(PREFIX_MATCH, infos)
    if rng.random() < 0.7:
        loads: dict[Hashable, InFlightLoad] = {
            ep: InFlightLoad(rng.randint(0, 3), rng.choice([0, 5, 100, 5000]))
            for ep in eps
            if rng.random() < 0.7
        }
        state.set_attributes(INFLIGHT_LOAD, loads)
    return state


def _mutate(rng: random.Random, eps: Sequence[Endpoint], churn: float) -> None:
    """A metrics refresh: some endpoints get a new reading, some an equal copy, the rest keep theirs.

    ``churn`` scales the share that changes: a few endpoints exercise the profile's
    incremental path (including a changed endpoint that held the min or the max), many
    its full recomputation.
    """
    for ep in eps:
        r = rng.random() / churn
        if r < 0.15:
            m = ep.metrics
            ep.metrics = replace(
                m,
                waiting_queue_size=max(m.waiting_queue_size + rng.choice([-1, 0, 1, 3]), 0),
                running_requests_size=rng.choice([m.running_requests_size, 0, 2]),
                kv_cache_usage_percent=rng.choice([m.kv_cache_usage_percent, rng.random(), 1.0, 0.0]),
                update_time=m.update_time + 0.05,
            )
        elif r < 0.25:
            ep.metrics = replace(ep.metrics)  # equal reading, new object


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(scenarios())
def test_fast_paths_pick_exactly_like_the_reference(sc: dict[str, Any]) -> None:
    eps: list[Endpoint] = sc["endpoints"]
    _profile, check = _pair(sc, eps)
    world = random.Random(sc["seed"] ^ 0x5EED)
    candidates: Sequence[Endpoint] = tuple(eps)
    for rnd in range(sc["rounds"] * 2):
        if rnd:
            _mutate(world, eps, sc["churn"])
            if world.random() < 0.3:  # the candidate list changes (subset, or a new tuple)
                candidates = tuple(ep for ep in eps if world.random() < 0.8) or tuple(eps)
        check(world, candidates)


Check = Callable[[random.Random, Sequence[Endpoint]], None]


def _pair(sc: dict[str, Any], eps: Sequence[Endpoint]) -> tuple[SchedulerProfile, Check]:
    """The profile under test for the scenario, and a check that runs one request on it and on the
    reference and asserts the same totals (bit for bit), picks and, when explained, trace."""
    seed: int = sc["seed"]
    k: int = sc["k"]
    plugins = []
    ref_scorers = []
    for t, w in sc["scorers"]:
        if t == "token-load-scorer":
            plugin = build(TokenLoadScorer, queueThresholdTokens=sc["cap"])
            ref_scorers.append((ref.token_load(plugin.queue_threshold_tokens), True, w))
        else:
            plugin = build(_CLASSES[t])
            formula, bounded = ref.SCORERS[t]
            ref_scorers.append((formula, bounded, w))
        plugins.append((plugin, w))

    inner = build(MaxScorePicker, maxNumOfEndpoints=k)
    inner.rng = random.Random(seed)
    picker = Recording(inner)
    ref_rng = random.Random(seed)
    filters: list[Any] = []
    ref_filters: list[Any] = []
    drop = frozenset(i for i in range(len(eps)) if (i * 2654435761 + seed) % 5 == 0)
    if sc["filter"] == "drop":
        filters = [DropFilter(drop)]
        ref_filters = [DropFilter(drop).filter]
    elif sc["filter"] == "affinity":
        params = {"affinityThreshold": sc["threshold"], "explorationProbability": 0.3}
        f_new = build(PrefixCacheAffinityFilter, **params)
        f_ref = build(PrefixCacheAffinityFilter, **params)
        f_new.rng, f_ref.rng = random.Random(seed + 1), random.Random(seed + 1)
        filters, ref_filters = [f_new], [f_ref.filter]
    profile = SchedulerProfile("p", filters=filters, scorers=plugins, picker=picker)

    def check(world: random.Random, candidates: Sequence[Endpoint]) -> None:
        state = _round_state(world, candidates)
        req = request(model=world.choice(MODELS))
        req.explain = world.random() < 0.4  # the explained path must give the same floats and picks
        expected = ref.run_profile(
            state,
            req,
            candidates,
            filters=ref_filters,
            scorers=ref_scorers,
            pick=lambda e, s: ref.max_score_pick(e, s, k, ref_rng),
        )
        try:
            got = profile.run(state, req, candidates)
        except SchedulingError:
            assert expected is None
            if req.explain:
                [trace] = state.get(PROFILE_TRACES) or []
                assert trace.error and not trace.scored
            return
        assert expected is not None
        want_pick, want_totals = expected
        assert _same(picker.seen, want_totals), (picker.seen, want_totals)
        assert got.target_endpoints == want_pick
        if req.explain:
            _check_trace(state, got, want_totals, [w for _, w in plugins])
        else:
            assert state.get(PROFILE_TRACES) is None

    return profile, check


def _sample(world: random.Random, ep: Endpoint) -> None:
    """One stored sample, as a scrape stores it: new values (some moving the fleet's min or max,
    some out of range or NaN), or an equal reading in a new object."""
    m = ep.metrics
    if world.random() < 0.2:
        ep.metrics = replace(m)
        return
    ep.metrics = replace(
        m,
        waiting_queue_size=world.choice([0, 60, max(m.waiting_queue_size + world.choice([-1, 1]), 0)]),
        running_requests_size=world.choice([m.running_requests_size, 0, 2, 60]),
        kv_cache_usage_percent=world.choice([m.kv_cache_usage_percent, world.random(), 1.0, 1.5, math.nan]),
        update_time=m.update_time + 0.05,
    )


def _new_endpoint(world: random.Random, i: int) -> Endpoint:
    md = EndpointMetadata(name=f"ns/new-{i}", address="10.9.0.1", port=9000 + i, pod_name=str(1000 + i))
    return Endpoint(
        md, Metrics(waiting_queue_size=world.randint(0, 60), kv_cache_usage_percent=world.random())
    )


def _next_candidates(
    world: random.Random, fleet: list[Endpoint], cur: Sequence[Endpoint]
) -> Sequence[Endpoint]:
    """Mostly the very same tuple (what the datastore hands out while membership holds); sometimes
    an endpoint added or removed, a subset, the same endpoints in a new tuple or a list."""
    r = world.random()
    if r < 0.75:
        return cur
    if r < 0.82:  # an endpoint joins
        ep = _new_endpoint(world, len(fleet))
        fleet.append(ep)
        return (*cur, ep)
    if r < 0.88 and len(cur) > 1:  # an endpoint leaves (it may still be scraped once more)
        gone = world.randrange(len(cur))
        return tuple(ep for i, ep in enumerate(cur) if i != gone)
    if r < 0.93:
        return tuple(ep for ep in cur if world.random() < 0.7) or tuple(cur)
    return list(cur) if world.random() < 0.5 else tuple(list(cur))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(scenarios(), st.integers(4, 30))
def test_samples_applied_on_arrival_pick_exactly_like_the_reference(
    sc: dict[str, Any], requests: int
) -> None:
    """Samples stored between requests (to candidates, to endpoints outside them, to endpoints that
    left) are applied by the profile as they arrive; every request still sees the reference's picks."""
    fleet: list[Endpoint] = list(sc["endpoints"])
    _profile, check = _pair(sc, fleet)
    world = random.Random(sc["seed"] ^ 0xA221)
    candidates: Sequence[Endpoint] = tuple(fleet)
    for _ in range(requests):
        for _ in range(world.choice([0, 1, 1, 2, 3, 5, 40])):
            _sample(world, world.choice(fleet))
        candidates = _next_candidates(world, fleet, candidates)
        check(world, candidates)


def test_samples_applied_on_arrival_serve_requests_without_a_rescan(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a steady candidate tuple and a few samples per request, samples are applied at arrival
    (``metrics_stored`` → ``_apply``) and requests neither rescan nor rebuild; the picks are the
    reference's."""
    calls = {"arrival": 0, "rescan": 0}
    refresh, rebuild, apply = MetricsScoreCache.refresh, MetricsScoreCache._rebuild, MetricsScoreCache._apply
    in_request = [False]

    def refreshing(self: MetricsScoreCache, *args: Any) -> None:
        in_request[0] = True
        try:
            refresh(self, *args)
        finally:
            in_request[0] = False

    def rebuilding(self: MetricsScoreCache, *args: Any) -> None:
        calls["rescan"] += 1
        rebuild(self, *args)

    def applying(self: MetricsScoreCache, *args: Any) -> int:
        calls["rescan" if in_request[0] else "arrival"] += 1
        return apply(self, *args)

    monkeypatch.setattr(MetricsScoreCache, "refresh", refreshing)
    monkeypatch.setattr(MetricsScoreCache, "_rebuild", rebuilding)
    monkeypatch.setattr(MetricsScoreCache, "_apply", applying)
    world = random.Random(5)
    fleet = [_new_endpoint(world, i) for i in range(100)]
    sc = {
        "scorers": [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0),
        ],
        "k": 1,
        "filter": "none",
        "threshold": 0.0,
        "cap": 0,
        "seed": 9,
    }
    profile, check = _pair(sc, fleet)
    candidates = tuple(fleet)
    check(world, candidates)
    check(world, candidates)  # the second request with these candidates adopts them
    assert _live(profile)
    before = dict(calls)
    for _ in range(200):
        for _ in range(2):
            _sample(world, world.choice(fleet))
        check(world, candidates)
    assert calls["rescan"] == before["rescan"]
    assert calls["arrival"] - before["arrival"] > 300  # some samples were equal readings: nothing to do
    # The datastore rebuilds its tuple with the same endpoints: the shortcut follows the new tuple.
    candidates = tuple(list(candidates))
    check(world, candidates)
    assert _cache(profile).tracked is candidates
    _sample(world, fleet[0])
    check(world, candidates)
    assert calls["rescan"] == before["rescan"]


def _check_trace(
    state: CycleState, got: ProfileRunResult, totals: Sequence[float], weights: list[float]
) -> None:
    """The trace's totals are the picker's floats and the sum, in scorer order, of its contributions."""
    [trace] = state.get(PROFILE_TRACES) or []
    assert _same(trace.totals, totals)
    assert trace.picked == got.target_endpoints
    assert [ep for ep, _ in got.scored] == list(trace.scored)
    assert len(trace.contributions) == len(weights)
    for i in range(len(trace.scored)):
        acc = trace.contributions[0][i] if weights else 0.0
        for c in trace.contributions[1:]:
            acc = acc + c[i]
        assert _same([acc], [trace.totals[i]])


def test_metrics_scorers_agree_with_their_per_endpoint_scores() -> None:
    """``score_metrics`` is ``score`` on the endpoints' readings (the optional path adds nothing)."""
    rng = random.Random(3)
    eps = [
        Endpoint(
            EndpointMetadata(name=f"e{i}", address="10.0.0.1", port=8000 + i),
            Metrics(
                waiting_queue_size=rng.randint(0, 4),
                running_requests_size=rng.randint(0, 4),
                kv_cache_usage_percent=rng.random(),
            ),
        )
        for i in range(50)
    ]
    classes: tuple[PluginClass[_IncrementalScorer], ...] = (
        QueueScorer,
        RunningRequestsSizeScorer,
        KVCacheUtilizationScorer,
    )
    for cls in classes:
        s = build(cls)
        ms = [ep.metrics for ep in eps]
        expected = list(s.score(CycleState(), request(), eps))
        assert list(s.score_metrics(ms)) == expected
        values = s.metric_values(ms)
        assert s.scores_for(values, s.summarize(values)) == expected
        assert s.scores_for(values[10:13], s.summarize(values)) == expected[10:13]


def _cache(profile: SchedulerProfile) -> MetricsScoreCache:
    cache = profile.cache
    assert cache is not None
    return cache


def _live(profile: SchedulerProfile) -> bool:
    """Whether the profile applies samples on arrival (a call, so mypy does not narrow it)."""
    return _cache(profile).live


class _FlakyQueueScorer(QueueScorer):
    """The queue scorer, failing on the per-sample path while ``broken`` is set."""

    broken = False

    def metric_values(self, metrics: Sequence[Metrics]) -> list[int]:
        if self.broken and len(metrics) == 1:
            raise RuntimeError("scorer bug")
        return super().metric_values(metrics)


def test_a_failing_update_on_arrival_stays_off_the_data_layer_and_the_next_request_rebuilds() -> None:
    """The assignment that stored the sample succeeds; the profile drops its snapshot, so the next
    request recomputes it from the readings and picks as if nothing had happened."""
    world = random.Random(8)
    fleet = [_new_endpoint(world, i) for i in range(20)]
    scorer = build(_FlakyQueueScorer)
    picker = Recording(build(MaxScorePicker))
    profile = SchedulerProfile("p", filters=[], scorers=[(scorer, 1.0)], picker=picker)
    candidates = tuple(fleet)
    for _ in range(2):
        profile.run(CycleState(), request(), candidates)
    assert _live(profile)
    scorer.broken = True
    fleet[3].metrics = Metrics(waiting_queue_size=0)
    fleet[7].metrics = Metrics(waiting_queue_size=0)
    assert fleet[3].metrics.waiting_queue_size == 0
    assert not _live(profile)
    scorer.broken = False
    profile.run(CycleState(), request(), candidates)
    queues = [ep.metrics.waiting_queue_size for ep in candidates]
    lo, hi = min(queues), max(queues)
    assert picker.seen == [(hi - q) / (hi - lo) for q in queues]
