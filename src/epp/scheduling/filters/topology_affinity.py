"""``topology-affinity-filter`` (llm-d-router): keep the second P/D stage near the first stage's pick.

A prefill leg hands its KV cache to the decode pod: over NVLink on the same host, over the
network otherwise.  Keeping prefill candidates within ``minAffinity`` of the decode pick makes
the transfer cheap; when none is that close the filter keeps everyone (it prefers, never fails).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import field_validator

from epp.datalayer.api import Endpoint
from epp.datalayer.topology import EXTRACTOR_TYPE, LEVEL_NAMES, Level, Topology, TopologyReader, compare
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.profiles.disagg import PEER_ENDPOINT

_UNRESOLVED: Any = object()


class TopologyReaderRef:
    """The ``topology-extractor`` a topology plugin reads, found on first use.

    Looked up lazily because plugins are built in config order and the extractor may come later.
    No such plugin means no topology at all, as upstream's optional dependency.
    """

    __slots__ = ("_handle", "_name", "_reader")

    def __init__(self, handle: Handle, name: str) -> None:
        self._handle = handle
        self._name = name or EXTRACTOR_TYPE
        self._reader: TopologyReader | None = _UNRESOLVED

    def get(self) -> TopologyReader | None:
        if self._reader is _UNRESOLVED:
            try:
                found = self._handle.plugin(self._name)
            except KeyError:
                found = None
            self._reader = found if isinstance(found, TopologyReader) else None
        return self._reader

    def peer(self, state: CycleState) -> tuple[TopologyReader, Topology] | None:
        """The reader and the peer pick's topology, or None when either is missing."""
        peer = state.get(PEER_ENDPOINT)
        reader = self.get() if peer is not None else None
        if peer is None or reader is None:
            return None
        topo = reader.topology(peer)
        return None if topo is None else (reader, topo)


class TopologyAffinityParams(PluginParams):
    min_affinity: str = "host"
    topology_producer_name: str = ""

    @field_validator("min_affinity")
    @classmethod
    def _level(cls, v: str) -> str:
        if v and v not in LEVEL_NAMES:
            raise ValueError(f'invalid topology level "{v}", must be one of host, rack, zone, region')
        return v


class TopologyAffinityFilter(PluginBase):
    """Keep candidates within ``minAffinity`` of the peer pick.  Type ``topology-affinity-filter``.

    With the ``peer-endpoint`` in the cycle state (``disagg-profile-handler``'s first-stage pick)
    and its topology known: keep candidates whose topology shares the peer's host (``host``),
    or rack, zone, region, up to ``minAffinity``; candidates without topology are dropped.  If
    nothing is left, or there is no peer or no peer topology, every candidate is kept.
    Parameters: ``minAffinity`` (``host``), ``topologyProducerName`` (the extractor's name,
    default ``topology-extractor``).
    """

    TYPE: ClassVar[str] = "topology-affinity-filter"
    PARAMS: ClassVar[type[PluginParams]] = TopologyAffinityParams

    def __init__(self, name: str, params: TopologyAffinityParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.min_affinity = LEVEL_NAMES[params.min_affinity or "host"]
        self.reader = TopologyReaderRef(handle, params.topology_producer_name)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        found = self.reader.peer(state)
        if found is None:
            return endpoints
        reader, peer = found
        limit: Level = self.min_affinity
        kept = [
            ep for ep in endpoints if (t := reader.topology(ep)) is not None and compare(peer, t) <= limit
        ]
        return kept or endpoints
