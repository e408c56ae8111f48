"""round-robin-fairness-policy: non-empty flows take turns in fairness-id order."""

from __future__ import annotations

import pytest

from epp.flowcontrol.api import FairnessPolicy, FairnessState
from epp.flowcontrol.fairness.round_robin import RoundRobinFairnessPolicy
from epp.plugin.base import NoParams
from epp.testing.flowcontrol import FakeQueue
from epp.testing.plugins import FakeHandle


def _state() -> FairnessState:
    policy = RoundRobinFairnessPolicy(RoundRobinFairnessPolicy.TYPE, NoParams(), FakeHandle())
    assert isinstance(policy, FairnessPolicy)
    return policy.new_state()


def _serve(state: FairnessState, n: int) -> list[str]:
    """Pick and dispatch ``n`` times, reporting head changes as the controller does."""
    served = []
    for _ in range(n):
        q = state.pick()
        if q is None:
            break
        assert isinstance(q, FakeQueue)
        q.pop()
        state.head_changed(q)
        served.append(q.flow.id)
    return served


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param({"b": 2, "a": 2, "c": 1}, ["a", "b", "c", "a", "b"], id="id-order-one-each-turn"),
        pytest.param({"a": 4, "b": 1}, ["a", "b", "a", "a", "a"], id="emptied-flow-drops-out"),
        pytest.param({}, [], id="empty-band"),
    ],
)
def test_turns(sizes: dict[str, int], expected: list[str]) -> None:
    """Each non-empty flow is served once per round, in id order; empty flows are skipped."""
    state = _state()
    for flow_id, n in sizes.items():
        state.head_changed(FakeQueue(flow_id, *range(n)))
    assert _serve(state, 10) == expected


def test_cursor_resumes_after_last_served() -> None:
    """A flow arriving mid-round is served in its id position after the flow served last."""
    state = _state()
    a, c = FakeQueue("a", 1, 2, 3), FakeQueue("c", 1, 2)
    state.head_changed(a)
    state.head_changed(c)
    assert _serve(state, 1) == ["a"]
    state.head_changed(FakeQueue("b", 1))
    assert _serve(state, 4) == ["b", "c", "a", "c"]


def test_cursor_survives_removal_of_last_served_flow() -> None:
    """When the flow served last empties, the next pick continues with the following id."""
    state = _state()
    queues = [FakeQueue(i, 1) for i in ("a", "b", "c")]
    for q in queues:
        state.head_changed(q)
    assert _serve(state, 2) == ["a", "b"]
    state.head_changed(FakeQueue("a", 1))
    assert _serve(state, 2) == ["c", "a"]
