"""InferencePool + Pods → endpoints in the datastore (GIE §7.2 to §7.4).

One endpoint per ready pod and active target port, named ``<pod>-rank-<i>`` (i = index of the
port in ``targetPorts``: data-parallel ranks).  Ready means no ``deletionTimestamp``, condition
``Ready=True`` and a pod IP: an evicted pod whose IP was cleared leaves no ghost endpoint.
The ``inference.networking.k8s.io/active-ports`` annotation (or llm-d-router's
``llm-d.ai/active-ports``; GIE's key wins when a pod carries both) narrows the ranks.  A changed
selector, port list or metrics port resyncs every pod; a deleted pool clears the datastore.

Pods of the whole namespace are watched and matched here, as controller-runtime's cache
does, so a selector change needs no new watch.  Each pod's endpoints are diffed, so an
unchanged pod causes no datastore event (no metrics loop restarts, no flapping).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import structlog

from epp.datalayer.api import EndpointMetadata
from epp.datastore.store import Datastore, PoolInfo
from epp.k8s.reflector import Obj, object_key

log = structlog.get_logger(__name__)

ACTIVE_PORTS: Final = "inference.networking.k8s.io/active-ports"
LLMD_ACTIVE_PORTS: Final = "llm-d.ai/active-ports"  # llm-d-router's name for the same annotation
V1_GROUP: Final = "inference.networking.k8s.io"
X_GROUP: Final = "inference.networking.x-k8s.io"
POOL_VERSIONS: Final = {V1_GROUP: "v1", X_GROUP: "v1alpha2"}


class PoolSpecError(ValueError):
    """The InferencePool object cannot be served (names the field)."""


def pool_from_object(obj: Obj) -> PoolInfo:
    """Read an InferencePool of either group: v1 (``selector.matchLabels``, ``targetPorts``) or
    the older v1alpha2 (``selector`` as a map, ``targetPortNumber``)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    raw_selector = spec.get("selector") or {}
    labels = raw_selector.get("matchLabels") if "matchLabels" in raw_selector else raw_selector
    if not isinstance(labels, Mapping) or not labels:
        raise PoolSpecError("spec.selector.matchLabels: must have at least one label")
    if "targetPorts" in spec:
        ports = tuple(int(p.get("number", 0)) for p in spec.get("targetPorts") or [])
    elif "targetPortNumber" in spec:
        ports = (int(spec["targetPortNumber"]),)
    else:
        ports = ()
    if not 1 <= len(ports) <= 8:
        raise PoolSpecError(f"spec.targetPorts: must have 1 to 8 ports, got {len(ports)}")
    for p in ports:
        if not 1 <= p <= 65535:
            raise PoolSpecError(f"spec.targetPorts: invalid port number {p}")
    if len(set(ports)) != len(ports):
        raise PoolSpecError("spec.targetPorts: port numbers must be unique")
    return PoolInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        target_ports=ports,
        selector={str(k): str(v) for k, v in labels.items()},
        app_protocol=str(spec.get("appProtocol") or "http"),
    )


def _ready(pod: Obj) -> bool:
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _active_ports(pod: Obj, ports: tuple[int, ...]) -> tuple[int, ...]:
    """The target ports the pod's active-ports annotation keeps; all of them without one.

    GIE's key is read first and llm-d-router's ``llm-d.ai/active-ports`` is the fallback, so a
    pod annotated with both follows GIE (llm-d-router itself prefers its own key; a pod
    carrying two different lists is a misconfiguration either way).
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    annotation = annotations.get(ACTIVE_PORTS)
    if annotation is None:
        annotation = annotations.get(LLMD_ACTIVE_PORTS)
    if not annotation:
        return ports
    wanted: set[int] = set()
    for part in str(annotation).split(","):
        part = part.strip()
        if part.isdigit() and int(part) > 0:
            wanted.add(int(part))
    return tuple(p for p in ports if p in wanted)


def matches(selector: Mapping[str, str], labels: Mapping[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_endpoints(pod: Obj, pool: PoolInfo, metrics_port_flag: int = 0) -> list[EndpointMetadata]:
    """The endpoints ``pod`` contributes to ``pool`` right now (empty if it is not serving)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not matches(pool.selector, labels) or not _ready(pod):
        return []
    status = pod.get("status") or {}
    ip = str(status.get("podIP"))
    name = str(meta.get("name", ""))
    active = set(_active_ports(pod, pool.target_ports))
    metrics_port = metrics_port_flag if metrics_port_flag > 0 and len(pool.target_ports) == 1 else 0
    return [
        EndpointMetadata(
            name=f"{name}-rank-{i}",
            address=ip,
            port=port,
            pod_name=name,
            namespace=str(meta.get("namespace", "")),
            metrics_port=metrics_port,
            labels=dict(labels),
            node_address=str(status.get("hostIP") or ""),
        )
        for i, port in enumerate(pool.target_ports)
        if port in active
    ]


class PoolEndpoints:
    """Reflector handler for Pods; ``set_pool`` is called by the pool watch (or once, standalone)."""

    def __init__(self, datastore: Datastore, *, metrics_port: int = 0) -> None:
        self._ds = datastore
        self._metrics_port = metrics_port
        self._pods: dict[str, Obj] = {}
        self._owned: dict[str, tuple[str, ...]] = {}  # pod key → endpoint names it contributed
        self._pods_synced = False

    @property
    def pool(self) -> PoolInfo | None:
        return self._ds.pool

    def set_pool(self, pool: PoolInfo | None) -> None:
        old = self._ds.pool
        if pool is None:
            if old is not None:
                log.info("pool_cleared", pool=old.name, namespace=old.namespace)
            self._ds.clear()
            self._ds.pool = None
            self._owned.clear()
            self._update_synced()
            return
        self._ds.pool = pool
        if old is None or (old.selector, old.target_ports) != (pool.selector, pool.target_ports):
            log.info("pool_set", pool=pool.name, selector=dict(pool.selector), target_ports=pool.target_ports)
            for key in list(self._pods):
                self._sync(key)
            for key in [k for k in self._owned if k not in self._pods]:
                self._drop(key)
        self._update_synced()

    # reflector handler ------------------------------------------------------------
    def upsert(self, obj: Obj) -> None:
        key = object_key(obj)
        self._pods[key] = obj
        self._sync(key)

    def delete(self, obj: Obj) -> None:
        key = object_key(obj)
        self._pods.pop(key, None)
        self._drop(key)

    def synced(self) -> None:
        self._pods_synced = True
        self._update_synced()

    # ------------------------------------------------------------------------------
    def _update_synced(self) -> None:
        self._ds.pool_synced = self._ds.pool is not None and self._pods_synced

    def _sync(self, key: str) -> None:
        pool = self._ds.pool
        wanted = pod_endpoints(self._pods[key], pool, self._metrics_port) if pool is not None else []
        names = tuple(m.name for m in wanted)
        for stale in set(self._owned.get(key, ())) - set(names):
            self._ds.remove(stale)
        for md in wanted:
            self._ds.upsert(md)
        if names:
            self._owned[key] = names
        else:
            self._owned.pop(key, None)

    def _drop(self, key: str) -> None:
        for name in self._owned.pop(key, ()):
            self._ds.remove(name)


class PoolObject:
    """Reflector handler for the one InferencePool: feeds ``PoolEndpoints.set_pool``."""

    def __init__(self, endpoints: PoolEndpoints, on_change: Any = None) -> None:
        self._endpoints = endpoints
        self._on_change = on_change  # called after the pool appears or changes (objectives replay)
        self.error = ""

    def upsert(self, obj: Obj) -> None:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            self._endpoints.set_pool(None)
            return
        try:
            pool = pool_from_object(obj)
        except (PoolSpecError, TypeError, ValueError) as e:
            self.error = str(e)
            log.error("pool_invalid", pool=object_key(obj), error=self.error, kept="last valid pool")  # noqa: TRY400
            return
        self.error = ""
        had = self._endpoints.pool is not None
        self._endpoints.set_pool(pool)
        if not had and self._on_change is not None:
            self._on_change()

    def delete(self, obj: Obj) -> None:
        self._endpoints.set_pool(None)

    def synced(self) -> None:
        pass
