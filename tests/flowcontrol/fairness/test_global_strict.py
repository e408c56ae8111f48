"""global-strict-fairness-policy: the best head across the band's flows, kept in a lazy heap."""

from __future__ import annotations

import random

from epp.flowcontrol.api import FairnessPolicy
from epp.flowcontrol.fairness.global_strict import GlobalStrictFairnessPolicy
from epp.plugin.base import NoParams
from epp.testing.flowcontrol import FakeItem, FakeQueue
from epp.testing.plugins import FakeHandle


def _policy() -> GlobalStrictFairnessPolicy:
    return GlobalStrictFairnessPolicy(GlobalStrictFairnessPolicy.TYPE, NoParams(), FakeHandle())


def test_is_a_fairness_policy() -> None:
    """The config builder recognises it as a FairnessPolicy."""
    assert isinstance(_policy(), FairnessPolicy)


def test_picks_queue_with_best_head_and_follows_head_changes() -> None:
    """pick returns the queue whose head orders first, and tracks heads as they change."""
    state = _policy().new_state()
    a = FakeQueue("a", 5.0, 7.0)
    b = FakeQueue("b", 6.0)
    for q in (a, b):
        state.head_changed(q)
    assert state.pick() is a
    a.pop()
    state.head_changed(a)
    assert state.pick() is b
    b.pop()
    state.head_changed(b)
    assert state.pick() is a
    a.pop()
    state.head_changed(a)
    assert state.pick() is None


def test_better_arrival_displaces_head() -> None:
    """An item that beats its queue's head (deadline orderings) becomes the pick."""
    state = _policy().new_state()
    a = FakeQueue("a", 5.0)
    b = FakeQueue("b", 4.0)
    state.head_changed(a)
    state.head_changed(b)
    a.push_front(FakeItem((1.0, 0.0, 99)))
    state.head_changed(a)
    assert state.pick() is a


def test_matches_brute_force_under_churn() -> None:
    """Across many random pushes and pops, pick always equals the min head by brute force,
    and the lazy heap stays bounded."""
    rng = random.Random(7)
    state = _policy().new_state()
    queues = [FakeQueue(f"q{i}") for i in range(20)]
    seq = 0
    for _ in range(5000):
        q = rng.choice(queues)
        if len(q) and rng.random() < 0.5:
            q.pop()
            state.head_changed(q)
        else:
            seq += 1
            if q.push(FakeItem((rng.random(), 0.0, seq))):
                state.head_changed(q)
        live = [x for x in queues if len(x)]
        expected = min(live, key=lambda x: x.items[0].order) if live else None
        assert state.pick() is expected
    assert len(state._heap) <= 2 * max(64, len(queues)) + 1  # type: ignore[attr-defined]
