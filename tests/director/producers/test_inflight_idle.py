"""inflight-load-producer: an idle counter's view is the shared ``IDLE`` object."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.api import Endpoint
from epp.director.producers.inflight_load import IDLE, InFlightLoadProducer
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint


def _routed(eps: Sequence[Endpoint]) -> SchedulingResult:
    return SchedulingResult({"default": ProfileRunResult(tuple(eps))}, "default")


def _request() -> InferenceRequest:
    return InferenceRequest(request_id="r", headers={}, request_size_bytes=400)


def test_a_counter_released_to_idle_shares_the_idle_view() -> None:
    """Back at zero with no peer counts, a counter's view is ``IDLE`` itself (no new object per
    snapshot); with a peer's work still counted it is not, and its value stays exact."""
    p: InFlightLoadProducer = build(InFlightLoadProducer)
    a, b = endpoint(0), endpoint(1)
    done = ResponseInfo(request_id="r", end_of_stream=True)
    state = CycleState()
    p.pre_request(state, _request(), _routed([a]))
    assert p.load_of(a) != IDLE
    p.response_complete(state, _request(), done, a)
    assert p.load_of(a) is IDLE
    p.apply("peer", [[b.metadata.name, 1, 5]])
    state = CycleState()
    p.pre_request(state, _request(), _routed([b]))
    p.response_complete(state, _request(), done, b)
    assert p.load_of(b) is not IDLE
    assert (p.load_of(b).requests, p.load_of(b).tokens) == (1, 5)
