"""``topology-extractor`` (llm-d-router): which pod labels say where an endpoint runs."""

from __future__ import annotations

from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.topology import (
    EXTRACTOR_TYPE,
    HOSTNAME_LABEL,
    RACK_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    Topology,
)
from epp.plugin.base import Handle, PluginBase, PluginParams


class TopologyExtractorParams(PluginParams):
    """Label keys; empty means upstream's default (the well-known Kubernetes labels)."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class TopologyExtractor(PluginBase):
    """Read an endpoint's topology from its labels.  Type ``topology-extractor``.

    Parameters (label keys): ``hostname`` (``kubernetes.io/hostname``), ``rack``
    (``topology.kubernetes.io/rack``), ``zone`` (``topology.kubernetes.io/zone``), ``region``
    (``topology.kubernetes.io/region``).  An endpoint with none of the four labels has no
    topology (None), as upstream leaves the attribute unset.  Upstream also takes the hostname
    from the pod's ``spec.hostname`` when the label is missing; pods' node labels are what
    Kubernetes sets, so this EPP reads labels only (docs/compatibility.md).
    """

    TYPE: ClassVar[str] = EXTRACTOR_TYPE
    PARAMS: ClassVar[type[PluginParams]] = TopologyExtractorParams

    def __init__(self, name: str, params: TopologyExtractorParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.labels = (
            params.hostname or HOSTNAME_LABEL,
            params.rack or RACK_LABEL,
            params.zone or ZONE_LABEL,
            params.region or REGION_LABEL,
        )

    def topology(self, endpoint: Endpoint) -> Topology | None:
        labels = endpoint.metadata.labels
        host, rack, zone, region = (labels.get(k, "") for k in self.labels)
        if not (host or rack or zone or region):
            return None
        return Topology(host, rack, zone, region)
