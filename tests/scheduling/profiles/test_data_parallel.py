"""data-parallel-profile-handler: the pick's real ip:port in the header, the target on primaryPort."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import ProfileRunResult, SchedulerProfileView
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.data_parallel import DATA_PARALLEL_HEADER, DataParallelProfileHandler
from epp.scheduling.scheduler import SchedulerProfile
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def test_rewrites_port_and_sets_header() -> None:
    handler = build(DataParallelProfileHandler, primaryPort=9000)
    rank = make_endpoint(0, port=8002)
    req = make_request()
    req.headers[DATA_PARALLEL_HEADER] = "spoofed:1"
    result = handler.process_results(CycleState(), req, {"default": ProfileRunResult((rank,))})
    (target,) = result.primary.target_endpoints
    assert target.hostport == "192.168.1.1:9000"
    assert target.name == rank.name and target.metrics is rank.metrics and target.health is rank.health
    assert req.header_mutation is not None
    assert req.header_mutation.set[DATA_PARALLEL_HEADER] == "192.168.1.1:8002"
    assert DATA_PARALLEL_HEADER in req.header_mutation.remove
    assert DATA_PARALLEL_HEADER not in req.headers
    again = handler.process_results(CycleState(), make_request(), {"default": ProfileRunResult((rank,))})
    assert again.primary.target_endpoints[0] is target  # cached, not rebuilt per request


def test_default_primary_port_and_pick_profiles() -> None:
    handler = build(DataParallelProfileHandler)
    assert handler.primary_port == 8000
    profiles: dict[str, SchedulerProfileView] = {
        "default": SchedulerProfile("default", filters=[], scorers=[], picker=build(MaxScorePicker))
    }
    assert handler.pick_profiles(CycleState(), make_request(), profiles, {}) == ("default",)
    assert handler.pick_profiles(CycleState(), make_request(), profiles, {"default": None}) == ()


def test_failed_profile_and_bad_port() -> None:
    handler = build(DataParallelProfileHandler)
    with pytest.raises(ValueError, match="failed to run scheduler profile 'default'"):
        handler.process_results(CycleState(), make_request(), {"default": None})
    with pytest.raises(ValueError, match="primaryPort"):
        build(DataParallelProfileHandler, primaryPort=70000)
