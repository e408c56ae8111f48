"""burst-prefix-cache-producer's joint placement: llm-d-router v0.10's assign_test.go vectors.

Replicas ``pod1..pod4`` upstream are ``pod-0..pod-3`` here (names order the same way); block
hashes are the upstream tests' literal values (placement only compares them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from epp.datalayer.api import Endpoint
from epp.director.prefix.burst import UNLIMITED, Entry, assign
from epp.testing.builders import make_endpoint


def replicas(n: int, running: Sequence[int] = ()) -> list[Endpoint]:
    return [make_endpoint(i, running=running[i] if i < len(running) else 0) for i in range(n)]


def pod(i: int) -> str:
    """Upstream's ``pod<i>`` (1-based)."""
    return f"default/pod-{i - 1}-rank-0"


def group(n: int, prefix: Sequence[int], eps: Sequence[Endpoint]) -> list[Entry]:
    return [Entry(tuple(prefix), eps) for _ in range(n)]


def counts(entries: Sequence[Entry]) -> dict[str | None, int]:
    return dict(Counter(e.assigned for e in entries))


def test_unlimited_colocates_whole_group() -> None:
    entries = group(8, [1, 2, 3], replicas(4))
    assign(entries, UNLIMITED, 0, False)
    assert {e.assigned for e in entries} == {pod(1)}


def test_cap_spreads_evenly() -> None:
    entries = group(8, [1, 2, 3], replicas(4))
    assign(entries, 2, 0, False)
    assert counts(entries) == {pod(1): 2, pod(2): 2, pod(3): 2, pod(4): 2}


def test_cap_fills_before_spilling() -> None:
    entries = group(8, [1, 2, 3], replicas(4))
    assign(entries, 4, 0, False)
    assert counts(entries) == {pod(1): 4, pod(2): 4}


def test_singleton_gets_no_affinity() -> None:
    entries = group(1, [1, 2, 3], replicas(2))
    assign(entries, UNLIMITED, 0, False)
    assert entries[0].assigned is None


def test_empty_prefix_gets_no_affinity() -> None:
    entries = group(2, [], replicas(2))
    assign(entries, UNLIMITED, 0, False)
    assert [e.assigned for e in entries] == [None, None]


def test_distinct_groups_spread_across_replicas() -> None:
    eps = replicas(4)
    a, b = group(8, [1, 2, 3], eps), group(8, [9, 9, 9], eps)
    assign([*a, *b], UNLIMITED, 0, False)
    assert {e.assigned for e in a} == {pod(1)}
    assert {e.assigned for e in b} == {pod(2)}


def test_shared_prefix_families_colocate_within_fair_share() -> None:
    eps = replicas(2)
    x1, x2 = group(2, [1, 2, 3], eps), group(2, [1, 2, 4], eps)
    y1, y2 = group(2, [7, 8, 5], eps), group(2, [7, 8, 6], eps)
    entries = [*x1, *x2, *y1, *y2]
    assign(entries, UNLIMITED, 2, False)
    assert x1[0].assigned == x2[0].assigned
    assert y1[0].assigned == y2[0].assigned
    assert x1[0].assigned != y1[0].assigned
    assert counts(entries) == {pod(1): 4, pod(2): 4}


def test_fair_share_spreads_prefix_sharing_groups() -> None:
    eps = replicas(4)
    entries = [e for last in (3, 4, 5, 6) for e in group(2, [1, 2, last], eps)]
    assign(entries, UNLIMITED, 2, False)
    assert counts(entries) == {pod(1): 2, pod(2): 2, pod(3): 2, pod(4): 2}


def test_singleton_attaches_to_overlapping_group() -> None:
    eps = replicas(2)
    gx, sx = group(2, [1, 2, 3], eps), group(1, [1, 2, 8], eps)
    gy, sy = group(2, [7, 8, 5], eps), group(1, [7, 8, 9], eps)
    entries = [*gx, *sx, *gy, *sy]
    assign(entries, UNLIMITED, 2, False)
    assert gx[0].assigned == gx[1].assigned == sx[0].assigned
    assert gy[0].assigned == sy[0].assigned
    assert counts(entries) == {pod(1): 3, pod(2): 3}


def test_lone_singleton_gets_no_affinity() -> None:
    eps = replicas(2)
    g, lone = group(2, [1, 2, 3], eps), group(1, [5, 5, 5], eps)
    assign([*g, *lone], UNLIMITED, 2, False)
    assert lone[0].assigned is None
    assert g[0].assigned == g[1].assigned is not None


def test_overlapping_singletons_colocate_without_groups() -> None:
    eps = replicas(2)
    entries = [e for last in (3, 4, 5, 6) for e in group(1, [1, 2, last], eps)]
    assign(entries, UNLIMITED, 2, False)
    assert all(e.assigned is not None for e in entries)
    assert counts(entries) == {pod(1): 2, pod(2): 2}


def test_shared_prefix_below_threshold_does_not_colocate() -> None:
    eps = replicas(2)
    x1, x2 = group(2, [1, 2, 3], eps), group(2, [1, 2, 4], eps)
    y1, y2 = group(2, [7, 8, 5], eps), group(2, [7, 8, 6], eps)
    entries = [*x1, *x2, *y1, *y2]
    assign(entries, UNLIMITED, 3, False)
    assert x1[0].assigned != x2[0].assigned
    assert counts(entries) == {pod(1): 4, pod(2): 4}


def test_single_replica_places_everything() -> None:
    eps = replicas(1)
    entries = [*group(4, [1, 2, 3], eps), *group(4, [9, 9, 9], eps)]
    assign(entries, UNLIMITED, 2, False)
    assert {e.assigned for e in entries} == {pod(1)}


def test_balance_by_tokens_spreads_large_prefix() -> None:
    eps = replicas(2)
    long, short1, short2 = group(2, [1, 2, 3, 4], eps), group(2, [5], eps), group(2, [6], eps)
    assign([*long, *short1, *short2], UNLIMITED, 0, False)
    assert long[0].assigned == short2[0].assigned  # by requests: a short unit joins the long one

    long, short1, short2 = group(2, [1, 2, 3, 4], eps), group(2, [5], eps), group(2, [6], eps)
    assign([*long, *short1, *short2], UNLIMITED, 0, True)
    assert long[0].assigned != short1[0].assigned
    assert short1[0].assigned == short2[0].assigned


def test_balance_by_tokens_discounts_shared_prefix() -> None:
    eps = replicas(2)
    head = list(range(1, 10))
    a1, a2, a3 = (group(2, [*head, last], eps) for last in (10, 11, 12))
    assign([*a1, *a2, *a3], UNLIMITED, 9, True)
    assert a1[0].assigned == a2[0].assigned == a3[0].assigned


def test_overflow_guard_balances_beyond_cap() -> None:
    entries = group(8, [1, 2, 3], replicas(2))
    assign(entries, 2, 0, False)
    assert all(e.assigned is not None for e in entries)
    assert counts(entries) == {pod(1): 4, pod(2): 4}


# ours: the tie-breaks upstream's ``less`` documents, each shown to decide -------------------


def test_running_requests_break_a_load_tie_before_the_name() -> None:
    entries = group(2, [1, 2], replicas(2, running=[5, 1]))
    assign(entries, UNLIMITED, 0, False)
    assert {e.assigned for e in entries} == {pod(2)}


def test_units_are_placed_longest_prefix_first() -> None:
    eps = replicas(2)
    short, long = group(2, [1], eps), group(2, [7, 8, 9], eps)
    assign([*short, *long], UNLIMITED, 0, False)
    assert long[0].assigned == pod(1)  # arrived second, placed first
    assert short[0].assigned == pod(2)
