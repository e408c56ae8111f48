"""Score normalisation shared by the load scorers."""

from __future__ import annotations


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
