"""The director's per-request objects: the hot constructors match the dataclass ones."""

from __future__ import annotations

import dataclasses

from epp.director.context import RequestContext, RoutingDecision
from epp.plugin.state import CycleState
from epp.request import InferenceRequest


def test_request_context_started_equals_the_keyword_constructor() -> None:
    """``RequestContext.started`` sets every field (an unset slot would raise here) as the keyword
    constructor does, with a CycleState of its own."""
    req = InferenceRequest(request_id="r", headers={})
    fast = RequestContext.started(req, True)
    slow = RequestContext(request=req, generated_request_id=True)
    for f in dataclasses.fields(RequestContext):
        if f.name == "state":
            assert type(getattr(fast, f.name)) is CycleState
            continue
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
    assert fast.state is not RequestContext.started(req, False).state


def test_plain_decision_equals_the_keyword_constructor() -> None:
    """``RoutingDecision.plain`` sets every field as the keyword constructor does."""
    fast = RoutingDecision.plain("10.0.0.1:8000", b"{}", True, (("x-request-id", "r"),), ("x-p",))
    slow = RoutingDecision(
        destination="10.0.0.1:8000",
        body=b"{}",
        body_changed=True,
        headers=(("x-request-id", "r"),),
        remove_headers=("x-p",),
    )
    for f in dataclasses.fields(RoutingDecision):
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
