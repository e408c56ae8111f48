"""OriginShares: each origin's last value per key, the owner's totals kept in step through ``changed``."""

from __future__ import annotations

import random

from epp.plugin.origin_shares import SNAPSHOT_ORIGIN, OriginShares


class Totals:
    """An owner as the plugins are: a total per key, changed only through the table's reports."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.reports: list[tuple[str, int, int]] = []
        self.shares: OriginShares[int] = OriginShares(0, self.changed)

    def changed(self, key: str, new: int, old: int) -> None:
        self.reports.append((key, new, old))
        left = self.total.get(key, 0) + new - old
        if left:
            self.total[key] = left
        else:
            self.total.pop(key, None)

    def expected(self) -> dict[str, int]:
        """The totals recomputed from the table: what ``changed`` must have kept."""
        out: dict[str, int] = {}
        for values in self.shares.debug().values():
            for key, v in values.items():
                out[key] = out.get(key, 0) + v
        return {k: v for k, v in out.items() if v}


def test_apply_replaces_an_origins_value_and_reports_the_difference() -> None:
    t = Totals()
    t.shares.apply("a", [("e1", 3), ("e2", 1)])
    t.shares.apply("b", [("e1", 2)])
    t.shares.apply("a", [("e1", 1)])  # absolute: a now holds 1 on e1, not 3 + 1
    assert t.total == {"e1": 3, "e2": 1}
    assert t.reports[-1] == ("e1", 1, 3)
    assert t.shares.debug() == {"a": {"e1": 1, "e2": 1}, "b": {"e1": 2}}


def test_a_repeated_delta_reports_nothing_and_a_zero_drops_the_key() -> None:
    t = Totals()
    t.shares.apply("a", [("e1", 3)])
    n = len(t.reports)
    t.shares.apply("a", [("e1", 3)])
    assert len(t.reports) == n  # idempotent: a repeated batch changes nothing
    t.shares.apply("a", [("e1", 0)])
    assert t.total == {}
    assert "a" not in t.shares  # an origin holding nothing is not kept


def test_forget_takes_exactly_that_origins_share_out() -> None:
    t = Totals()
    t.shares.apply("a", [("e1", 3), ("e2", 4)])
    t.shares.apply("b", [("e1", 2)])
    t.shares.forget("a")
    assert t.total == {"e1": 2}
    assert list(t.shares.values_of("e1")) == [2]
    t.shares.forget("a")  # twice, or an origin never heard: nothing
    t.shares.forget("nobody")
    assert t.total == {"e1": 2}


def test_restored_values_yield_key_by_key_to_the_first_delta_and_go_with_any_forget() -> None:
    t = Totals()
    t.shares.restore([("b", [("e1", 2)]), (SNAPSHOT_ORIGIN, [("e1", 5), ("e2", 7)])])
    assert t.total == {"e1": 7, "e2": 7}
    t.shares.apply("src", [("e1", 6)])  # the snapshot's source reports e1 itself: no double count
    assert t.total == {"e1": 8, "e2": 7}
    assert t.shares.debug()[SNAPSHOT_ORIGIN] == {"e2": 7}
    t.shares.forget("b")  # any forget drops the placeholder: it is as stale
    assert t.total == {"e1": 6}
    assert SNAPSHOT_ORIGIN not in t.shares
    assert t.shares.peers() == {"src": {"e1": 6}}


def test_peers_leaves_the_placeholder_out_and_restore_replaces_an_origin_whole() -> None:
    t = Totals()
    t.shares.apply("a", [("e1", 1), ("e2", 2)])
    t.shares.restore([("a", [("e3", 3)]), (SNAPSHOT_ORIGIN, [("e1", 4)])])
    assert t.shares.peers() == {"a": {"e3": 3}}
    assert t.shares.debug() == {"a": {"e3": 3}, SNAPSHOT_ORIGIN: {"e1": 4}}
    assert t.total == {"e1": 4, "e3": 3}


def test_discard_key_forgets_the_key_without_reporting() -> None:
    t = Totals()
    t.shares.apply("a", [("e1", 1), ("e2", 2)])
    t.shares.apply("b", [("e1", 3)])
    n = len(t.reports)
    t.shares.discard_key("e1")  # the owner dropped e1's total itself
    assert len(t.reports) == n
    assert list(t.shares.values_of("e1")) == []
    t.shares.forget("b")  # nothing of e1 comes back out of the owner's totals
    assert t.reports[n:] == []


def test_tuple_values_compare_with_their_zero() -> None:
    seen: list[tuple[str, tuple[int, int], tuple[int, int]]] = []
    shares: OriginShares[tuple[int, int]] = OriginShares(
        (0, 0), lambda k, new, old: seen.append((k, new, old))
    )
    shares.apply("a", [("e1", (1, 10)), ("e2", (0, 0))])
    assert seen == [("e1", (1, 10), (0, 0))]
    assert shares.peers() == {"a": {"e1": (1, 10)}}
    shares.drop("a")
    assert seen[-1] == ("e1", (0, 0), (1, 10))


def test_random_histories_keep_the_totals_equal_to_the_table() -> None:
    rng = random.Random(30)
    origins = ["a", "b", "c", SNAPSHOT_ORIGIN]
    keys = ["e1", "e2", "e3", "e4"]
    t = Totals()
    for _ in range(2000):
        op = rng.random()
        if op < 0.7:
            origin = rng.choice(origins)
            rows = [(k, rng.choice([0, 0, 1, 2, 5])) for k in rng.sample(keys, rng.randint(1, 3))]
            t.shares.apply(origin, rows)
        elif op < 0.8:
            t.shares.forget(rng.choice(origins[:3]))
        elif op < 0.9:
            t.shares.restore(
                [
                    (rng.choice(origins[:3]), [(rng.choice(keys), 3)]),
                    (SNAPSHOT_ORIGIN, [(rng.choice(keys), 4)]),
                ]
            )
        else:
            t.shares.drop(rng.choice(origins))
        assert t.total == t.expected()
        assert all(v >= 0 for v in t.total.values())
