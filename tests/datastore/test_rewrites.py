"""InferenceModelRewrite precedence and weighted choice."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp.datastore.rewrites import ModelRewrite, RewriteRule, RewriteTable, RewriteTarget


def rw(
    name: str, matches: tuple[str, ...], targets: tuple[tuple[str, int], ...], created: float
) -> ModelRewrite:
    rule = RewriteRule(matches=matches, targets=tuple(RewriteTarget(model=m, weight=w) for m, w in targets))
    return ModelRewrite(name=name, rules=(rule,), created=created)


@pytest.mark.parametrize(
    ("rewrites", "model", "expected"),
    [
        pytest.param([rw("g", (), (("generic", 1),), 1)], "m", "generic", id="generic-matches-anything"),
        pytest.param(
            [rw("g", (), (("generic", 1),), 1), rw("e", ("m",), (("exact", 1),), 2)],
            "m",
            "exact",
            id="exact-beats-generic",
        ),
        pytest.param(
            [rw("new", ("m",), (("newer", 1),), 5), rw("old", ("m",), (("older", 1),), 1)],
            "m",
            "older",
            id="oldest-wins",
        ),
        pytest.param([rw("e", ("m",), (("x", 1),), 1)], "other", None, id="no-rule"),
    ],
)
def test_precedence(rewrites: list[ModelRewrite], model: str, expected: str | None) -> None:
    """Exact matches beat generic rules; among equals the oldest object wins."""
    table = RewriteTable()
    table.set_all(rewrites)
    d = table.decide(model, random.Random(0))
    assert (d.target_model if d else None) == expected


def test_weighted_choice_follows_weights() -> None:
    """Targets are chosen in proportion to their weights (3:1 over 4000 draws)."""
    table = RewriteTable()
    table.set_all([rw("w", ("m",), (("a", 3), ("b", 1)), 0)])
    rng = random.Random(1)
    counts = Counter(table.decide("m", rng).target_model for _ in range(4000))  # type: ignore[union-attr]
    assert 0.70 < counts["a"] / 4000 < 0.80


def test_all_zero_weights_are_uniform() -> None:
    """With every weight zero the choice is uniform, as in GIE."""
    table = RewriteTable()
    table.set_all([rw("z", ("m",), (("a", 0), ("b", 0)), 0)])
    rng = random.Random(2)
    counts = Counter(table.decide("m", rng).target_model for _ in range(2000))  # type: ignore[union-attr]
    assert 0.4 < counts["a"] / 2000 < 0.6


def test_applies_follows_the_rules_with_targets() -> None:
    """``applies`` (the director's one test a request) is True exactly while a rule has targets,
    through every change of the table."""
    table = RewriteTable()
    seen = [table.applies]
    table.set_all([ModelRewrite(name="empty", rules=(RewriteRule(matches=("m",), targets=()),), created=0)])
    seen.append(table.applies)  # a rule without targets rewrites nothing
    assert table.decide("m", random.Random(0)) is None
    table.upsert(rw("e", ("m",), (("x", 1),), 1))
    seen.append(table.applies)
    table.remove("e")
    seen.append(table.applies)
    table.upsert(rw("g", (), (("generic", 1),), 2))
    seen.append(table.applies)
    table.clear()
    seen.append(table.applies)
    assert seen == [False, False, True, False, True, False]
