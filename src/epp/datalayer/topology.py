"""Where an endpoint runs (host, rack, zone, region): the signal llm-d-router's topology plugins read.

llm-d-router's ``topology-extractor`` writes it as an endpoint attribute from the pod's labels.
Here the labels are already on ``EndpointMetadata`` (pods in Kubernetes, ``labels`` of a static
or file endpoint), so the extractor is a label mapping and the readers compute the topology
from the endpoint: four dict lookups, no per-endpoint state to keep in step with the datastore.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint

EXTRACTOR_TYPE: Final = "topology-extractor"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
RACK_LABEL: Final = "topology.kubernetes.io/rack"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"


@dataclass(frozen=True, slots=True)
class Topology:
    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class Level(enum.IntEnum):
    """How close two endpoints are; lower is closer (llm-d-router's ``topoutil.Level``)."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4


LEVEL_NAMES: Final = {"host": Level.HOST, "rack": Level.RACK, "zone": Level.ZONE, "region": Level.REGION}


def compare(peer: Topology | None, candidate: Topology | None) -> Level:
    """The closest level both share a non-empty value at, checked host first (upstream's order)."""
    if peer is None or candidate is None:
        return Level.NONE
    if peer.hostname and peer.hostname == candidate.hostname:
        return Level.HOST
    if peer.rack and peer.rack == candidate.rack:
        return Level.RACK
    if peer.zone and peer.zone == candidate.zone:
        return Level.ZONE
    if peer.region and peer.region == candidate.region:
        return Level.REGION
    return Level.NONE


@runtime_checkable
class TopologyReader(Protocol):
    """What the topology filter and scorer ask of a ``topology-extractor``."""

    def topology(self, endpoint: Endpoint) -> Topology | None: ...
