"""``combine``'s fused passes add the floats exactly as one pass per scorer would."""

from __future__ import annotations

import random

import pytest

from epp.scheduling.weighting import combine


def _one_pass_per_scorer(
    lists: list[list[float]], weights: list[float], n: int, partial: list[float] | None
) -> list[float]:
    """The reference: start from the partial sum (or the first weighted list), then add each
    scorer's weighted scores in order, one list at a time."""
    if partial is None:
        if not lists:
            return [0.0] * n
        totals = [x * weights[0] for x in lists[0]]
        lists, weights = lists[1:], weights[1:]
    else:
        totals = list(partial)
    for scores, w in zip(lists, weights, strict=True):
        totals = [t + x * w for t, x in zip(totals, scores, strict=True)]
    return totals


@pytest.mark.parametrize("with_partial", [False, True])
@pytest.mark.parametrize("k", range(7))
def test_fused_passes_are_bit_identical_to_one_pass_per_scorer(k: int, with_partial: bool) -> None:
    rng = random.Random(k * 2 + with_partial)
    for n in (1, 4, 9):
        for _ in range(50):
            lists = [[rng.random() for _ in range(n)] for _ in range(k)]
            weights = [rng.choice((1.0, 2.0, 3.0, 0.1, rng.random() * 5)) for _ in range(k)]
            partial = [rng.random() * 7 for _ in range(n)] if with_partial else None
            got = combine(lists, weights, n, partial)
            assert got == _one_pass_per_scorer(lists, weights, n, partial)  # == on floats: bit for bit
            if partial is not None:
                assert got is not partial  # a new list: the cached partial sum stays as it was
