"""exclude-peer-filter: the prefill stage of a symmetric (prefill-decode) fleet never picks the decode pod."""

from __future__ import annotations

import pytest

from epp.app.registry import default_registry
from epp.errors import ServiceUnavailable
from epp.plugin.base import Plugin
from epp.plugin.state import CycleState
from epp.scheduling.api import Filter
from epp.scheduling.filters.by_label import DecodeFilter, PrefillFilter
from epp.scheduling.filters.peer import ExcludePeerFilter
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider
from epp.scheduling.profiles.disagg import PEER_ENDPOINT, DisaggProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.profiles.pd_fleet import fleet


def test_registered() -> None:
    assert default_registry().get("exclude-peer-filter") is ExcludePeerFilter


def test_without_a_peer_every_candidate_stays() -> None:
    eps = fleet("prefill-decode", "prefill-decode")
    assert list(build(ExcludePeerFilter).filter(CycleState(), make_request("m"), eps)) == eps


def test_drops_the_peer_by_host_and_port() -> None:
    """The peer is matched by ip:port: another object for the same pod is dropped, another port kept."""
    eps = [make_endpoint(0), make_endpoint(1), make_endpoint(0, port=8001)]
    state = CycleState()
    state.put(PEER_ENDPOINT, make_endpoint(0))
    kept = build(ExcludePeerFilter).filter(state, make_request("m"), eps)
    assert [ep.hostport for ep in kept] == ["192.168.1.2:8000", "192.168.1.1:8001"]


def test_peer_alone_leaves_nothing() -> None:
    eps = fleet("prefill-decode")
    state = CycleState()
    state.put(PEER_ENDPOINT, eps[0])
    assert list(build(ExcludePeerFilter).filter(state, make_request("m"), eps)) == []


def symmetric_scheduler(decider: Plugin, *, exclude: bool = True) -> Scheduler:
    """decode: decode-filter + queue; prefill: prefill-filter (+ exclude-peer-filter) + queue."""
    handler = build(DisaggProfileHandler, handle=FakeHandle([decider]), deciders={"prefill": "d"})
    deciders: dict[str, Plugin] = {"d": decider}
    handler.bind_plugins(deciders.get)
    picker, queue = build(MaxScorePicker), build(QueueScorer)
    prefill_filters: list[Filter] = [build(PrefillFilter), *([build(ExcludePeerFilter)] if exclude else [])]
    return Scheduler(
        handler,
        [
            SchedulerProfile("decode", filters=[build(DecodeFilter)], scorers=[(queue, 1.0)], picker=picker),
            SchedulerProfile("prefill", filters=prefill_filters, scorers=[(queue, 1.0)], picker=picker),
        ],
    )


@pytest.mark.parametrize("idle", range(4))
def test_symmetric_fleet_never_pairs_a_pod_with_itself(idle: int) -> None:
    """The least-loaded pod wins decode; prefill then goes to the next best, never to the same pod.
    Without the filter the same scores would send both stages to one pod (the control)."""
    queues = [5, 6, 7, 8]
    queues[idle] = 0
    eps = fleet(*["prefill-decode"] * 4, queues=queues)
    decider = build(AlwaysDisaggPDDecider, name="d")
    result = symmetric_scheduler(decider).schedule(CycleState(), make_request("m"), eps)
    decode = result.primary.target_endpoints[0]
    prefill = result.profile_results["prefill"]
    assert decode is eps[idle]
    assert prefill is not None
    assert prefill.target_endpoints[0] is not decode
    assert prefill.target_endpoints[0] is eps[0 if idle else 1]  # the best of the others
    control = symmetric_scheduler(decider, exclude=False).schedule(CycleState(), make_request("m"), eps)
    control_prefill = control.profile_results["prefill"]
    assert control_prefill is not None
    assert control_prefill.target_endpoints[0] is control.primary.target_endpoints[0]


@pytest.mark.parametrize("idle", range(4))
def test_symmetric_fleet_declined_request_lands_on_any_pod(idle: int) -> None:
    """A declined request is served whole by the decode pick, which may be any of the pods."""
    queues = [5, 6, 7, 8]
    queues[idle] = 0
    eps = fleet(*["prefill-decode"] * 4, queues=queues)
    never = build(PrefixBasedPDDecider, name="d")  # nonCachedTokens 0: never disaggregates
    result = symmetric_scheduler(never).schedule(CycleState(), make_request("m"), eps)
    assert set(result.profile_results) == {"decode"}
    assert result.primary.target_endpoints[0] is eps[idle]
    assert result.disagg is not None and result.disagg.prefill == ""


def test_single_pod_symmetric_fleet_fails_closed() -> None:
    eps = fleet("prefill-decode")
    decider = build(AlwaysDisaggPDDecider, name="d")
    with pytest.raises(ServiceUnavailable):
        symmetric_scheduler(decider).schedule(CycleState(), make_request("m"), eps)
