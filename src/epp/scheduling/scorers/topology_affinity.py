"""``topology-affinity-scorer`` (llm-d-router): grade second-stage P/D candidates by closeness to the peer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.topology import Level, compare
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory
from epp.scheduling.filters.topology_affinity import TopologyReaderRef

# Upstream's fixed grades: NVLink on one host is worth far more than any network hop.
LEVEL_SCORES: Final = {
    Level.HOST: 1.0,
    Level.RACK: 0.2,
    Level.ZONE: 0.05,
    Level.REGION: 0.02,
    Level.NONE: 0.0,
}


class TopologyAffinityScorerParams(PluginParams):
    topology_producer_name: str = ""


class TopologyAffinityScorer(PluginBase):
    """Type ``topology-affinity-scorer``, category Affinity.

    Same host as the ``peer-endpoint`` → 1.0, same rack → 0.2, zone → 0.05, region → 0.02,
    else (or no peer, no topology) 0.  Parameters: ``topologyProducerName``.
    """

    TYPE: ClassVar[str] = "topology-affinity-scorer"
    PARAMS: ClassVar[type[PluginParams]] = TopologyAffinityScorerParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: TopologyAffinityScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.reader = TopologyReaderRef(handle, params.topology_producer_name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        found = self.reader.peer(state)
        if found is None:
            return [0.0] * len(endpoints)
        reader, peer = found
        return [LEVEL_SCORES[compare(peer, reader.topology(ep))] for ep in endpoints]
