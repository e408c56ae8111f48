"""Score normalisation shared by the load scorers.

``min_max_scores`` is the whole formula; ``min_max_bounds`` and ``min_max_apply`` are its two
halves, for the profile's incremental path: the bounds are taken over every candidate's
reading, the formula applied to only the readings that changed while the bounds hold.
"""

from __future__ import annotations

from collections.abc import Sequence


def min_max_scores(values: list[int]) -> list[float]:
    """``(max - v) / (max - min)``: the smallest value scores 1, the largest 0; all equal → 1."""
    # Queue lengths take few distinct values: min, max and the formula run over those only.
    distinct = set(values)
    lo = min(distinct)
    hi = max(distinct)
    if hi == lo:
        return [1.0] * len(values)
    span = float(hi - lo)
    memo = {v: (hi - v) / span for v in distinct}
    return list(map(memo.__getitem__, values))


def min_max_bounds(values: Sequence[int]) -> tuple[int, int]:
    """``(min, max)`` of the readings: what every score of ``min_max_scores`` depends on besides its own."""
    distinct = set(values)  # queue lengths take few distinct values: min and max run over those
    return min(distinct), max(distinct)


def min_max_apply(values: Sequence[int], bounds: tuple[int, int]) -> list[float]:
    """``min_max_scores`` of ``values`` (any subset of the readings) given the bounds of all of them."""
    lo, hi = bounds
    if hi == lo:
        return [1.0] * len(values)
    span = float(hi - lo)
    if len(values) < 16:
        return [(hi - v) / span for v in values]
    # Queue lengths take few distinct values: the formula runs over those only.
    memo = {v: (hi - v) / span for v in set(values)}
    return list(map(memo.__getitem__, values))


def min_max_update(bounds: tuple[int, int], old: Sequence[int], new: Sequence[int]) -> tuple[int, int] | None:
    """The bounds after the readings ``old`` became ``new``, or None when a rescan is needed.

    Known without a rescan unless an old reading sat on a bound: it may have been the only
    endpoint there, and then the bound moves inwards to a value only a rescan can find.
    """
    lo, hi = bounds
    for v in old:
        if v in (lo, hi):
            return None
    return min(lo, *new), max(hi, *new)
