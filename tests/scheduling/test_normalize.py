"""The min-max normalisation and its incremental halves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epp.scheduling.normalize import min_max_apply, min_max_bounds, min_max_scores, min_max_update

readings = st.lists(st.integers(0, 6), min_size=1, max_size=40)


def test_smallest_scores_one_largest_zero_and_all_equal_scores_one() -> None:
    assert min_max_scores([4, 0, 2]) == [0.0, 1.0, 0.5]
    assert min_max_scores([3, 3]) == [1.0, 1.0]


@given(readings)
def test_the_halves_make_the_whole_on_any_subset(values: list[int]) -> None:
    bounds = min_max_bounds(values)
    whole = min_max_scores(values)
    assert min_max_apply(values, bounds) == whole
    assert min_max_apply(values[1::2], bounds) == whole[1::2]


@given(readings, st.data())
def test_update_gives_the_rescanned_bounds_or_asks_for_a_rescan(
    values: list[int], data: st.DataObject
) -> None:
    positions = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=3, unique=True))
    new = data.draw(st.lists(st.integers(0, 8), min_size=len(positions), max_size=len(positions)))
    old = [values[i] for i in positions]
    after = list(values)
    for i, v in zip(positions, new, strict=True):
        after[i] = v
    updated = min_max_update(min_max_bounds(values), old, new)
    if updated is not None:
        assert updated == min_max_bounds(after)
    else:  # only when a changed reading sat on a bound
        lo, hi = min_max_bounds(values)
        assert any(v in (lo, hi) for v in old)
