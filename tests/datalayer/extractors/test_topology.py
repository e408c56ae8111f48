"""topology-extractor: the label keys it reads, and no topology without any of them."""

from __future__ import annotations

from epp.datalayer.extractors.topology import TopologyExtractor
from epp.datalayer.topology import HOSTNAME_LABEL, Level, Topology, compare
from epp.testing.builders import make_endpoint
from epp.testing.plugins import build


def test_extractor_custom_labels() -> None:
    extractor = build(TopologyExtractor, hostname="node", zone="az")
    topo = extractor.topology(make_endpoint(0, labels={"node": "n1", "az": "a"}))
    assert topo is not None
    assert (topo.hostname, topo.rack, topo.zone, topo.region) == ("n1", "", "a", "")
    assert extractor.topology(make_endpoint(0, labels={HOSTNAME_LABEL: "x"})) is None


def test_default_labels_and_compare_levels() -> None:
    extractor = build(TopologyExtractor)
    topo = extractor.topology(
        make_endpoint(0, labels={HOSTNAME_LABEL: "n1", "topology.kubernetes.io/zone": "z"})
    )
    assert topo == Topology("n1", "", "z", "")
    peer = Topology("h1", "r1", "z1", "reg1")
    assert compare(peer, Topology("h1")) is Level.HOST
    assert compare(peer, Topology("h2", "r1")) is Level.RACK
    assert compare(peer, Topology(zone="z1")) is Level.ZONE
    assert compare(peer, Topology(region="reg1")) is Level.REGION
    assert compare(peer, Topology()) is Level.NONE  # empty values never match
    assert compare(None, peer) is Level.NONE
