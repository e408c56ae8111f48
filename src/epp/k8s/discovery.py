"""Kubernetes mode: the watches that keep the datastore equal to the cluster.

Pool mode (``--pool-name``): the InferencePool (by name, in its namespace), the namespace's Pods,
and, when API discovery finds them, InferenceObjectives and InferenceModelRewrites (a missing
CRD is logged, not fatal).  Standalone mode (``--endpoint-selector``): the pool is made up from
the flags and only Pods are watched, narrowed server-side by the selector.
Every ``k8s-notification-source`` in the config gets a watch of its kind.

Every replica runs all of this whether or not it leads (hot standby): a replica that becomes
leader already has its endpoints, their metrics and its objectives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp
import structlog

from epp.datalayer.api import GroupVersionKind, NotificationEvent
from epp.datastore.store import Datastore, PoolInfo
from epp.k8s.client import Kube, ResourceWatch
from epp.k8s.errors import ApiError
from epp.k8s.objectives import ObjectiveHandler, RewriteHandler, replay
from epp.k8s.pool import POOL_VERSIONS, X_GROUP, PoolEndpoints, PoolObject
from epp.k8s.reflector import Backoff, Obj, Reflector

log = structlog.get_logger(__name__)

OBJECTIVES_VERSION: Final = "v1alpha2"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoverySpec:
    """What to watch; built from the flags."""

    namespace: str
    pool_name: str = ""  # pool mode
    pool_group: str = "inference.networking.k8s.io"
    selector: Mapping[str, str] = field(default_factory=dict)  # standalone mode
    target_ports: tuple[int, ...] = ()
    standalone_name: str = ""  # standalone: the EPP's deployment name stands in for the pool
    app_protocol: str = "http"  # standalone: what the configured parser speaks
    metrics_port: int = 0  # --model-server-metrics-port

    @property
    def standalone(self) -> bool:
        return not self.pool_name


class KindSubscriber(Protocol):
    """A ``k8s-notification-source``: told about every change of one kind of object."""

    @property
    def gvk(self) -> GroupVersionKind: ...

    @property
    def typed_name(self) -> Any: ...

    def notify(self, event: NotificationEvent) -> None: ...


class _NotificationHandler:
    """Turns reflector events into ``NotificationEvent``s for one notification source."""

    def __init__(self, source: KindSubscriber) -> None:
        self._source = source

    def _event(self, kind: Any, obj: Obj, with_object: bool) -> NotificationEvent:
        meta = obj.get("metadata") or {}
        return NotificationEvent(
            type=kind,
            gvk=self._source.gvk,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            object=obj if with_object else None,
        )

    def upsert(self, obj: Obj) -> None:
        self._source.notify(self._event("AddOrUpdate", obj, True))

    def delete(self, obj: Obj) -> None:
        self._source.notify(self._event("Delete", obj, False))

    def synced(self) -> None:
        pass


class KubernetesDiscovery:
    """``async with KubernetesDiscovery(...)`` runs the watches; the datastore follows the cluster."""

    def __init__(
        self,
        kube: Kube,
        datastore: Datastore,
        spec: DiscoverySpec,
        *,
        notification_sources: Sequence[KindSubscriber] = (),
    ) -> None:
        self._kube = kube
        self._ds = datastore
        self.spec = spec
        self._notification_sources = tuple(notification_sources)
        self.endpoints = PoolEndpoints(datastore, metrics_port=spec.metrics_port)
        self.reflectors: dict[str, Reflector] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.missing_kinds: list[str] = []

    # lifecycle --------------------------------------------------------------------
    async def __aenter__(self) -> KubernetesDiscovery:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        spec = self.spec
        if spec.standalone:
            self.endpoints.set_pool(
                PoolInfo(
                    name=spec.standalone_name,
                    namespace=spec.namespace,
                    target_ports=spec.target_ports,
                    selector=dict(spec.selector),
                    app_protocol=spec.app_protocol,
                )
            )
            selector = ",".join(f"{k}={v}" for k, v in spec.selector.items())
            self._reflect(
                "pods",
                ResourceWatch(self._kube, "", "v1", "pods", spec.namespace, label_selector=selector),
                self.endpoints,
            )
        else:
            version = POOL_VERSIONS.get(spec.pool_group, "v1")
            pool = PoolObject(self.endpoints, on_change=self._replay_objects)
            self._reflect(
                "inferencepool",
                ResourceWatch(
                    self._kube,
                    spec.pool_group,
                    version,
                    "inferencepools",
                    spec.namespace,
                    field_selector=f"metadata.name={spec.pool_name}",
                ),
                pool,
            )
            self._reflect("pods", ResourceWatch(self._kube, "", "v1", "pods", spec.namespace), self.endpoints)
            self._tasks.append(asyncio.create_task(self._objectives(), name="k8s:discover-objectives"))
        for source in self._notification_sources:
            self._tasks.append(
                asyncio.create_task(self._notifications(source), name=f"k8s:notify:{source.gvk}")
            )
        log.info(
            "k8s_discovery_started",
            mode="standalone" if spec.standalone else "pool",
            namespace=spec.namespace,
            pool=spec.pool_name or spec.standalone_name,
        )

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    async def wait_synced(self) -> None:
        """Until the first list of every started watch has been applied (tests, startup logs)."""
        for r in list(self.reflectors.values()):
            await r.has_synced.wait()

    # ------------------------------------------------------------------------------
    def _reflect(self, what: str, source: ResourceWatch, handler: Any) -> Reflector:
        r = Reflector(what, source, handler)
        self.reflectors[what] = r
        self._tasks.append(asyncio.create_task(r.run(), name=f"k8s:{what}"))
        return r

    def _replay_objects(self) -> None:
        """The pool came back after a delete cleared the datastore: re-apply known objects."""
        for what in ("inferenceobjectives", "inferencemodelrewrites"):
            r = self.reflectors.get(what)
            if r is not None:
                replay(r.store, r.handler.upsert)

    async def _served(self, group: str, version: str) -> dict[str, str]:
        """Kind → plural of what the API server serves in group/version ({} when it is absent);
        retries (with backoff) until the server answers."""
        backoff = Backoff()
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        while True:
            try:
                body = await self._kube.json("GET", path)
            except ApiError as e:
                if e.status == 404:
                    return {}
                err = str(e)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                err = str(e) or type(e).__name__
            else:
                return {
                    str(r.get("kind")): str(r.get("name"))
                    for r in body.get("resources") or []
                    if "/" not in str(r.get("name", ""))
                }
            delay = backoff.next()
            log.warning(
                "k8s_discovery_error", group_version=f"{group}/{version}", error=err, retry_in=round(delay, 2)
            )
            await asyncio.sleep(delay)

    async def _objectives(self) -> None:
        served = await self._served(X_GROUP, OBJECTIVES_VERSION)
        spec = self.spec
        for kind, plural, handler_cls in (
            ("InferenceObjective", "inferenceobjectives", ObjectiveHandler),
            ("InferenceModelRewrite", "inferencemodelrewrites", RewriteHandler),
        ):
            if served.get(kind) != plural:
                self.missing_kinds.append(kind)
                log.warning(
                    "k8s_kind_not_served",
                    kind=kind,
                    group_version=f"{X_GROUP}/{OBJECTIVES_VERSION}",
                    effect="not watched; every request has priority 0"
                    if kind == "InferenceObjective"
                    else "not watched; no model rewrites",
                )
                continue
            handler = handler_cls(self._ds, spec.pool_name, spec.pool_group)
            self._reflect(
                plural,
                ResourceWatch(self._kube, X_GROUP, OBJECTIVES_VERSION, plural, spec.namespace),
                handler,
            )

    async def _notifications(self, source: KindSubscriber) -> None:
        gvk = source.gvk
        served = await self._served(gvk.group, gvk.version)
        plural = served.get(gvk.kind)
        if plural is None:
            self.missing_kinds.append(gvk.kind)
            log.error(
                "k8s_kind_not_served",
                kind=str(gvk),
                effect=f"notification source {source.typed_name} gets no events",
            )
            return
        self._reflect(
            f"notify:{gvk}",
            ResourceWatch(self._kube, gvk.group, gvk.version, plural, self.spec.namespace),
            _NotificationHandler(source),
        )

    def status(self) -> dict[str, Any]:
        """For debug dumps: each watch's resourceVersion, object count and error count."""
        return {
            what: {
                "synced": r.has_synced.is_set(),
                "resourceVersion": r.resource_version,
                "objects": len(r.store),
                "lists": r.lists,
                "watches": r.watches,
                "errors": r.errors,
                "lastError": r.last_error,
            }
            for what, r in self.reflectors.items()
        }
