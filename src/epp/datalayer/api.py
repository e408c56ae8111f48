"""Endpoints, their metrics, and the contracts of data sources and extractors."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from epp.health.state import EndpointHealth
from epp.plugin.base import Plugin


def join_host_port(host: str, port: int) -> str:
    """``ip:port``, bracketing IPv6 literals as Go's net.JoinHostPort does."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointMetadata:
    """Who an endpoint is and where to reach it.  Immutable; replaced when the pod changes."""

    name: str  # unique id: "<namespace>/<pod>-rank-<i>" in Kubernetes, user-chosen otherwise
    address: str  # IP or hostname
    port: int
    pod_name: str = ""
    namespace: str = ""
    metrics_port: int = 0  # 0: scrape the serving port
    labels: Mapping[str, str] = field(default_factory=dict)
    hostport: str = ""  # "ip:port" for the destination header; derived when empty
    node_address: str = ""  # the node's IP (a pod's hostIP), for node-level exporters; "" unknown
    metrics_address: str = ""  # where metrics are served when not at ``address`` (a peer cluster's); "" same

    def __post_init__(self) -> None:
        if not self.hostport:
            object.__setattr__(self, "hostport", join_host_port(self.address, self.port))

    @property
    def metrics_host(self) -> str:
        return join_host_port(self.metrics_address or self.address, self.metrics_port or self.port)


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """One consistent reading of a model server's state.  The data layer replaces, never mutates."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0  # 0..1
    active_models: frozenset[str] = frozenset()  # running LoRA adapters
    waiting_models: frozenset[str] = frozenset()  # waiting LoRA adapters
    max_active_models: int = 0
    kv_cache_max_token_capacity: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    update_time: float = 0.0  # time.monotonic() of the last successful extraction; 0.0 = never


EMPTY_METRICS = Metrics()


class MetricsListener(Protocol):
    """Told, synchronously, each time an endpoint it listens to stores a new ``Metrics``.

    For state derived from readings that is cheaper to keep up to date one sample at a
    time than to recompute per request (the scheduler's metric scores).  Called inside
    whoever assigned ``endpoint.metrics`` (an extractor, on the event loop): it must be
    quick and must not raise.
    """

    def metrics_stored(self, endpoint: Endpoint) -> None: ...


_set = object.__setattr__


class Endpoint:
    """A model-server endpoint.  Identity (hash/eq) is the object: one per live endpoint.

    ``metrics`` is swapped whole by the data layer, so a reader that takes
    ``m = ep.metrics`` once sees a consistent reading.  Every assignment to ``metrics``
    tells the endpoint's ``MetricsListener``s (held weakly: a listener that is gone, e.g.
    a scheduler profile replaced by a config reload, is dropped).  The hook sits in
    ``__setattr__`` rather than a property so that reading ``ep.metrics`` stays a plain
    slot read (the request path reads it for every candidate) and no writer, however it
    assigns, can bypass it.
    """

    __slots__ = ("_listeners", "health", "metadata", "metrics")

    _listeners: tuple[weakref.ref[MetricsListener], ...]

    def __init__(self, metadata: EndpointMetadata, metrics: Metrics = EMPTY_METRICS) -> None:
        _set(self, "_listeners", ())
        self.metadata = metadata
        self.metrics = metrics
        self.health = EndpointHealth(metadata.name)  # every health signal about it goes here (epp.health)

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any attribute name

        def __setattr__(self, name: str, value: Any) -> None:
            _set(self, name, value)
            if name == "metrics" and self._listeners:
                self._notify()

    def _notify(self) -> None:
        dead = False
        for ref in self._listeners:
            listener = ref()
            if listener is None:
                dead = True
            else:
                listener.metrics_stored(self)
        if dead:
            _set(self, "_listeners", tuple(r for r in self._listeners if r() is not None))

    def add_metrics_listener(self, listener: MetricsListener) -> None:
        """Tell ``listener`` of every new ``metrics`` from now on (once, however often added)."""
        if not any(r() is listener for r in self._listeners):
            _set(self, "_listeners", (*self._listeners, weakref.ref(listener)))

    def remove_metrics_listener(self, listener: MetricsListener) -> None:
        _set(self, "_listeners", tuple(r for r in self._listeners if r() not in (None, listener)))

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def hostport(self) -> str:
        return self.metadata.hostport

    def __repr__(self) -> str:
        return f"Endpoint({self.metadata.name!r}, {self.metadata.hostport})"


@runtime_checkable
class EndpointObserver(Protocol):
    """Told when endpoints come and go (endpoint-notification-source consumers, per-endpoint state)."""

    def endpoint_added(self, endpoint: Endpoint) -> None: ...

    def endpoint_removed(self, endpoint: Endpoint) -> None: ...


@runtime_checkable
class DataSource(Plugin, Protocol):
    """Fetches raw data about one endpoint, e.g. its Prometheus exposition text.

    ``OUTPUT`` is the type ``poll`` returns; extractors attached to the source must
    accept it (checked at startup).  ``poll`` must honour cancellation and never block
    the event loop.
    """

    OUTPUT: ClassVar[type[Any]]

    async def poll(self, endpoint: Endpoint) -> Any: ...


@runtime_checkable
class Extractor(Plugin, Protocol):
    """Turns a source's output into endpoint state (usually a new ``Metrics``)."""

    INPUT: ClassVar[type[Any]]

    def extract(self, data: Any, endpoint: Endpoint) -> None: ...


@dataclass(frozen=True, slots=True)
class SourceBinding:
    """A data source and the extractors fed by its output, as the ``dataLayer`` config wires them."""

    source: DataSource
    extractors: tuple[Extractor, ...]


# --- additions by the data layer (additive; nothing above changed) --------------------


def is_stale(metrics: Metrics, now: float, threshold: float) -> bool:
    """Whether ``metrics`` are older than ``threshold`` seconds at ``now`` (``time.monotonic()``).

    A reading never taken (``update_time == 0.0``) is stale.  Staleness means "unknown",
    never "saturated": see docs/decisions-datalayer.md for how plugins should treat it.
    """
    updated = metrics.update_time
    return updated == 0.0 or now - updated > threshold


@runtime_checkable
class BindsExtractors(Protocol):
    """A source that adapts to the extractors the config attaches to it.

    The data-layer runtime calls ``bind`` once, before anything runs; the source may
    reject extractors it cannot feed by raising ``epp.errors.ConfigError``.
    """

    def bind(self, extractors: Sequence[Plugin]) -> None: ...


@runtime_checkable
class HasPollTimeout(Protocol):
    """A polling source with its own deadline per poll (``None``: the runtime's default)."""

    @property
    def poll_timeout(self) -> float | None: ...


@runtime_checkable
class NotificationSource(Plugin, Protocol):
    """A source that pushes events to its extractors instead of being polled.

    ``OUTPUT`` is the event type it delivers; the runtime binds the extractors once.
    """

    OUTPUT: ClassVar[type[Any]]

    def bind(self, extractors: Sequence[Plugin]) -> None: ...


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """An endpoint entered (``AddOrUpdate``) or left (``Delete``) the datastore."""

    type: Literal["AddOrUpdate", "Delete"]
    endpoint: Endpoint


@runtime_checkable
class EndpointEventSink(Protocol):
    """A source told by the runtime when endpoints come and go (not a datastore observer).

    Kept apart from ``EndpointObserver`` on purpose: the config registers every observer
    plugin with the datastore, and a source must not hear each event twice.
    """

    def endpoint_event(self, event: EndpointEvent) -> None: ...


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    """A Kubernetes object type; ``str()`` is Go's ``GroupVersionKind.String()``."""

    group: str
    version: str
    kind: str

    def __str__(self) -> str:
        return f"{self.group}/{self.version}, Kind={self.kind}"


@dataclass(frozen=True, slots=True)
class NotificationEvent:
    """A watched Kubernetes object changed (``AddOrUpdate``, with the object) or was deleted."""

    type: Literal["AddOrUpdate", "Delete"]
    gvk: GroupVersionKind
    namespace: str
    name: str
    object: Mapping[str, Any] | None = None  # the object as a dict; None on Delete


@runtime_checkable
class NotificationExtractor(Plugin, Protocol):
    """Consumes Kubernetes object events from a ``k8s-notification-source`` of the same GVK."""

    @property
    def gvk(self) -> GroupVersionKind: ...

    def extract_notification(self, event: NotificationEvent) -> None: ...


@runtime_checkable
class EndpointSink(Protocol):
    """What a discovery plugin fills: the datastore (which sits above this layer)."""

    def replace_all(self, metadatas: Sequence[EndpointMetadata]) -> None: ...


@runtime_checkable
class EndpointDiscovery(Protocol):
    """A plugin that finds the endpoints itself (``dataLayer.discovery``, e.g. ``file-discovery``).

    The data-layer runtime starts it with the datastore on entry (an error there fails
    startup) and stops it on exit.
    """

    async def start_discovery(self, sink: EndpointSink) -> None: ...

    async def stop(self) -> None: ...
