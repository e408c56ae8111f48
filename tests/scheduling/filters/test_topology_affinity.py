"""topology-affinity-filter and -scorer: llm-d-router's vectors (filter_test.go, scorer_test.go)."""

from __future__ import annotations

import pytest

from epp.datalayer.api import Endpoint
from epp.datalayer.extractors.topology import TopologyExtractor
from epp.datalayer.topology import HOSTNAME_LABEL, RACK_LABEL, REGION_LABEL, ZONE_LABEL
from epp.plugin.state import CycleState
from epp.scheduling.filters.topology_affinity import TopologyAffinityFilter
from epp.scheduling.profiles.disagg import PEER_ENDPOINT
from epp.scheduling.scorers.topology_affinity import TopologyAffinityScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build

_KEYS = (HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL, REGION_LABEL)
_n = 0


def ep(host: str = "", rack: str = "", zone: str = "", region: str = "") -> Endpoint:
    global _n
    _n += 1
    labels = {k: v for k, v in zip(_KEYS, (host, rack, zone, region), strict=True) if v}
    return make_endpoint(_n, labels=labels)


PEER = ("h1", "r1", "z1", "reg1")


def _state(peer: Endpoint | None) -> CycleState:
    state = CycleState()
    if peer is not None:
        state.put(PEER_ENDPOINT, peer)
    return state


def _handle() -> FakeHandle:
    return FakeHandle([build(TopologyExtractor)])


def _filter(min_affinity: str, peer: Endpoint | None, eps: list[Endpoint]) -> list[Endpoint]:
    f = build(TopologyAffinityFilter, handle=_handle(), minAffinity=min_affinity)
    return list(f.filter(_state(peer), make_request(), eps))


def test_keeps_only_matching_min_affinity() -> None:
    same_host, same_rack, no_match = ep(*PEER), ep("h2", "r1", "z1", "reg1"), ep("h3", "r3", "z3", "reg3")
    assert _filter("host", ep(*PEER), [same_host, same_rack, no_match]) == [same_host]
    assert _filter("rack", ep(*PEER), [same_host, same_rack, no_match]) == [same_host, same_rack]


def test_sparse_candidate_matches_at_its_only_level_and_fails_open_below() -> None:
    rack_only = ep(rack="r1")
    assert _filter("rack", ep(*PEER), [rack_only]) == [rack_only]
    assert _filter("host", ep(*PEER), [rack_only]) == [rack_only]  # fails open


def test_no_peer_or_no_peer_topology_keeps_everyone() -> None:
    eps = [ep("h1"), ep("h2")]
    assert _filter("host", None, eps) == eps
    assert _filter("host", ep(), eps) == eps


def test_endpoint_without_topology_is_dropped() -> None:
    same_host, bare = ep("h1"), ep()
    assert _filter("host", ep("h1"), [same_host, bare]) == [same_host]


def test_without_an_extractor_the_filter_keeps_everyone() -> None:
    f = build(TopologyAffinityFilter)
    eps = [ep("h1"), ep("h2")]
    assert list(f.filter(_state(ep("h1")), make_request(), eps)) == eps


def test_bad_level_names_the_parameter() -> None:
    with pytest.raises(ValueError, match="datacenter"):
        build(TopologyAffinityFilter, minAffinity="datacenter")


def test_scorer_grades_by_level() -> None:
    scorer = build(TopologyAffinityScorer, handle=_handle())
    eps = [
        ep(*PEER),
        ep("h2", "r1", "z1", "reg1"),
        ep("h2", "r2", "z1", "reg1"),
        ep("h2", "r2", "z2", "reg1"),
        ep("h2", "r2", "z2", "reg2"),
        ep(),
    ]
    assert scorer.score(_state(ep(*PEER)), make_request(), eps) == [1.0, 0.2, 0.05, 0.02, 0.0, 0.0]
    assert scorer.score(_state(None), make_request(), eps) == [0.0] * 6
