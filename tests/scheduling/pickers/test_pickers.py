"""max-score, random and weighted-random pickers."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.scheduling.api import Picker
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.random import RandomPicker
from epp.scheduling.pickers.weighted_random import WeightedRandomPicker
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def _eps(n: int) -> list[Endpoint]:
    return [endpoint(i) for i in range(n)]


def _pick(picker: Picker, eps: list[Endpoint], scores: list[float]) -> list[int]:
    result = picker.pick(CycleState(), request(), eps, scores)
    return [eps.index(e) for e in result.target_endpoints]


@pytest.mark.parametrize(
    ("max_n", "scores", "expected"),
    [
        pytest.param(1, [1.5, 1.9, 0.8], [1], id="best"),
        pytest.param(2, [1.5, 1.9, 0.8], [1, 0], id="fallback-in-order"),
        pytest.param(3, [0.1, 0.9, 0.5], [1, 2, 0], id="all-sorted"),
        pytest.param(10, [0.1, 0.9], [1, 0], id="more-than-available"),
        pytest.param(0, [0.2, 0.3], [1], id="zero-means-one"),
        pytest.param(-4, [0.2, 0.3], [1], id="negative-means-one"),
    ],
)
def test_max_score_order(max_n: int, scores: list[float], expected: list[int]) -> None:
    """Highest totals first; maxNumOfEndpoints bounds the list; <= 0 means 1."""
    picker = build(MaxScorePicker, maxNumOfEndpoints=max_n)
    assert isinstance(picker, Picker)
    assert _pick(picker, _eps(len(scores)), scores) == expected


@pytest.mark.parametrize(
    ("max_n", "scores", "tied", "fixed_prefix"),
    [
        pytest.param(1, [1.0, 2.0, 2.0, 2.0], {1, 2, 3}, [], id="single-pick-among-ties"),
        pytest.param(2, [3.0, 2.0, 2.0, 2.0, 1.0], {1, 2, 3}, [0], id="tie-at-the-cut"),
        pytest.param(3, [2.0, 2.0, 2.0, 0.0], {0, 1, 2}, [], id="tie-group-fully-taken"),
    ],
)
def test_max_score_ties_are_uniform(
    max_n: int, scores: list[float], tied: set[int], fixed_prefix: list[int]
) -> None:
    """Among equal totals every endpoint is equally likely to come first (seeded, 3000 draws)."""
    picker = build(MaxScorePicker, maxNumOfEndpoints=max_n)
    picker.rng = random.Random(1234)
    eps = _eps(len(scores))
    firsts: Counter[int] = Counter()
    for _ in range(3000):
        got = _pick(picker, eps, scores)
        assert got[: len(fixed_prefix)] == fixed_prefix
        assert len(got) == min(max_n, len(scores))
        assert set(got[len(fixed_prefix) :]) <= tied
        firsts[got[len(fixed_prefix)]] += 1
    assert set(firsts) == tied
    expected = 3000 / len(tied)
    for count in firsts.values():
        assert abs(count - expected) < 0.15 * expected


def test_random_picker_ignores_scores() -> None:
    """Every endpoint is picked about equally often whatever its score; k distinct endpoints."""
    picker = build(RandomPicker)
    picker.rng = random.Random(7)
    eps = _eps(4)
    counts = Counter(_pick(picker, eps, [0.0, 0.0, 10.0, 0.0])[0] for _ in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(abs(c - 1000) < 150 for c in counts.values())
    picker3 = build(RandomPicker, maxNumOfEndpoints=3)
    picker3.rng = random.Random(7)
    for _ in range(50):
        got = _pick(picker3, eps, [0.0] * 4)
        assert len(got) == 3
        assert len(set(got)) == 3


def test_weighted_random_proportional() -> None:
    """With one pick, each endpoint wins in proportion to its total; zero totals never win."""
    picker = build(WeightedRandomPicker)
    picker.rng = random.Random(42)
    eps = _eps(4)
    scores = [1.0, 2.0, 3.0, 0.0]
    counts = Counter(_pick(picker, eps, scores)[0] for _ in range(6000))
    assert counts[3] == 0
    for i, w in enumerate(scores[:3]):
        assert abs(counts[i] - 6000 * w / 6) < 0.1 * 6000 * w / 6


def test_weighted_random_all_zero_falls_back_to_uniform() -> None:
    """When no total is positive every endpoint can be chosen (random-picker fallback)."""
    picker = build(WeightedRandomPicker, maxNumOfEndpoints=2)
    picker.rng = random.Random(3)
    eps = _eps(3)
    seen: Counter[int] = Counter()
    for _ in range(600):
        got = _pick(picker, eps, [0.0, 0.0, 0.0])
        assert len(set(got)) == 2
        seen.update(got)
    assert set(seen) == {0, 1, 2}


def test_weighted_random_multi_pick_excludes_zero_until_needed() -> None:
    """Several picks: positive totals come before zero ones, and picks are distinct."""
    picker = build(WeightedRandomPicker, maxNumOfEndpoints=3)
    picker.rng = random.Random(5)
    eps = _eps(3)
    for _ in range(200):
        got = _pick(picker, eps, [0.5, 0.0, 0.7])
        assert sorted(got[:2]) == [0, 2]
        assert got[2] == 1


def _max_score() -> Picker:
    return build(MaxScorePicker)


def _random() -> Picker:
    return build(RandomPicker)


def _weighted() -> Picker:
    return build(WeightedRandomPicker)


@pytest.mark.parametrize("make", [_max_score, _random, _weighted])
def test_each_instance_breaks_ties_on_its_own_seed(make: Callable[[], Picker]) -> None:
    """Active-active replicas (and exec'd workers) each build their own picker: seeded alike, two
    replicas deciding at the same moment on the same shared view would pick the same endpoint of
    a tie and pile onto it.  64 draws among 8 tied endpoints agree by chance with p = 8**-64."""
    eps = _eps(8)
    a, b = make(), make()
    assert [_pick(a, eps, [1.0] * 8)[0] for _ in range(64)] != [
        _pick(b, eps, [1.0] * 8)[0] for _ in range(64)
    ]
