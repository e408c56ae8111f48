"""Datastore: the live set of endpoints plus pool-level objects, with a cached snapshot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from epp.datalayer.api import Endpoint, EndpointMetadata, EndpointObserver
from epp.datastore.rewrites import RewriteTable

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolInfo:
    """The InferencePool (or its no-Kubernetes stand-in) this EPP serves."""

    name: str
    namespace: str = "default"
    target_ports: tuple[int, ...] = ()
    selector: Mapping[str, str] = field(default_factory=dict)
    app_protocol: str = "http"


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """An InferenceObjective: a named priority.  Higher numbers are more important; < 0 is sheddable."""

    name: str
    priority: int = 0


class Datastore:
    """Endpoints by name, pool info and objectives.

    ``endpoints()`` returns a tuple rebuilt only when membership changes, so the request
    path takes it without allocating.  Observers (the data layer, per-endpoint plugin
    state) hear about every add and remove, in registration order.
    """

    def __init__(self) -> None:
        self._endpoints: dict[str, Endpoint] = {}
        self._snapshot: tuple[Endpoint, ...] = ()
        self._observers: list[EndpointObserver] = []
        self._objectives: dict[str, Objective] = {}
        self.rewrites = RewriteTable()
        self.pool: PoolInfo | None = None
        self.pool_synced = False

    # observers --------------------------------------------------------------------
    def add_observer(self, observer: EndpointObserver) -> None:
        self._observers.append(observer)
        for ep in self._snapshot:
            observer.endpoint_added(ep)

    def remove_observer(self, observer: EndpointObserver) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    # endpoints --------------------------------------------------------------------
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._snapshot

    def get(self, name: str) -> Endpoint | None:
        return self._endpoints.get(name)

    def upsert(self, metadata: EndpointMetadata) -> Endpoint:
        """Add an endpoint, or replace its metadata if it exists (metrics are kept unless it moved)."""
        existing = self._endpoints.get(metadata.name)
        if existing is not None:
            if existing.metadata == metadata:
                return existing
            moved = (existing.metadata.address, existing.metadata.port, existing.metadata.metrics_port) != (
                metadata.address,
                metadata.port,
                metadata.metrics_port,
            )
            if not moved:
                existing.metadata = metadata
                return existing
            self.remove(metadata.name)
        ep = Endpoint(metadata)
        self._endpoints[metadata.name] = ep
        self._snapshot = tuple(self._endpoints.values())
        log.info("endpoint_added", endpoint=metadata.name, address=metadata.hostport)
        for obs in tuple(self._observers):
            obs.endpoint_added(ep)
        return ep

    def remove(self, name: str) -> Endpoint | None:
        ep = self._endpoints.pop(name, None)
        if ep is None:
            return None
        self._snapshot = tuple(self._endpoints.values())
        log.info("endpoint_removed", endpoint=name, address=ep.metadata.hostport)
        for obs in tuple(self._observers):
            obs.endpoint_removed(ep)
        return ep

    def replace_all(self, metadatas: Sequence[EndpointMetadata]) -> None:
        """Make the endpoint set exactly ``metadatas`` (used by static and file discovery)."""
        wanted = {m.name: m for m in metadatas}
        for name in [n for n in self._endpoints if n not in wanted]:
            self.remove(name)
        for m in metadatas:
            self.upsert(m)

    def clear(self) -> None:
        for name in list(self._endpoints):
            self.remove(name)
        self._objectives.clear()
        self.rewrites.clear()

    # objectives -------------------------------------------------------------------
    def set_objectives(self, objectives: Sequence[Objective]) -> None:
        self._objectives = {o.name: o for o in objectives}

    def upsert_objective(self, objective: Objective) -> None:
        self._objectives[objective.name] = objective

    def remove_objective(self, name: str) -> None:
        self._objectives.pop(name, None)

    def objective(self, name: str) -> Objective | None:
        return self._objectives.get(name)

    def objectives(self) -> Sequence[Objective]:
        return tuple(self._objectives.values())
