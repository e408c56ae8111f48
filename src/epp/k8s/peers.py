"""The EPP's own replicas as sync peers, from Kubernetes (issue 30; llm-d's ``dataLayer.peerDiscovery``).

Two ways to find them, both through the reflector (list + watch, resume, relist on 410, back
off on errors while keeping the last set):

* **EndpointSlices of the EPP's Service** (``service``): the addresses Kubernetes itself
  considers ready, with the port named ``portName`` (Dynamo's ``replica-agg``; ours ``peer``).
  The cheaper watch — a slice changes when a replica's readiness does, not on every pod
  status update — and what a rolling update is designed around.
* **Pods by label selector** (``selector``): for a Deployment without a Service; the port is
  the container port named ``portName``, and readiness is the pod's ``Ready`` condition.

Either way a peer is ready (not terminating), has an address, and is not this pod (by
``POD_IP`` or ``POD_NAME``).  An API-server outage keeps the last known set: a replica cut off
from the API server goes on syncing with the peers it knew.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import structlog
from pydantic import Field

from epp.errors import ConfigError
from epp.k8s.client import Kube, ResourceWatch
from epp.k8s.reflector import Obj, Reflector, object_key
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.sync.peers import Peer

log = structlog.get_logger(__name__)

SERVICE_LABEL: Final = "kubernetes.io/service-name"
DEFAULT_PORT_NAME: Final = "peer"

# What the EPP's Role needs when peer discovery is on (deploy/ adds it only then): apiGroup,
# resource, verbs.
ENDPOINTSLICE_GRANTS: Final = ("discovery.k8s.io", "endpointslices", ("list", "watch"))
POD_GRANTS: Final = ("", "pods", ("list", "watch"))


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerDiscoverySpec:
    """Exactly one of ``service`` and ``selector``; ``self_ip``/``self_name`` leave this pod out."""

    namespace: str
    service: str = ""
    selector: Mapping[str, str] = field(default_factory=dict)
    port_name: str = DEFAULT_PORT_NAME
    self_ip: str = ""
    self_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.service) == bool(self.selector):
            raise ConfigError("k8s-peer-discovery: set exactly one of service and selector")
        if not self.port_name:
            raise ConfigError("k8s-peer-discovery: portName must not be empty")


def _named_port(ports: Any, name: str, number_key: str) -> int:
    for p in ports or []:
        if p.get("name") == name and p.get(number_key):
            return int(p[number_key])
    return 0


def slice_peers(obj: Obj, spec: PeerDiscoverySpec) -> frozenset[Peer]:
    """The ready peers one EndpointSlice lists (none without the named port)."""
    port = _named_port(obj.get("ports"), spec.port_name, "port")
    if not port:
        return frozenset()
    out = set()
    for ep in obj.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        if cond.get("ready") is False or cond.get("terminating") is True:  # unset ready means ready
            continue
        name = str((ep.get("targetRef") or {}).get("name", ""))
        for address in ep.get("addresses") or []:
            if address == spec.self_ip or (name and name == spec.self_name):
                continue
            out.add(Peer(name or address, str(address), port))
    return frozenset(out)


def pod_peers(obj: Obj, spec: PeerDiscoverySpec) -> frozenset[Peer]:
    """The pod as a peer, if it is ready, has an IP and declares the named container port."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ip, name = str(status.get("podIP") or ""), str(meta.get("name", ""))
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    if meta.get("deletionTimestamp") or not ip or not ready or ip == spec.self_ip or name == spec.self_name:
        return frozenset()
    containers = (obj.get("spec") or {}).get("containers") or []
    for c in containers:
        port = _named_port(c.get("ports"), spec.port_name, "containerPort")
        if port:
            return frozenset({Peer(name, ip, port)})
    return frozenset()


class KubernetesPeers:
    """A ``PeerSource`` (``epp.sync.peers``): ``async with`` it watches; ``updates()`` yields each new set.

    The first set is yielded once the first list is applied; after that, only a set that
    differs from the last one yielded (a slice or pod update that leaves the peers as they
    were yields nothing).  Sets are tuples sorted by peer, as the sync hub takes them.
    """

    def __init__(self, kube: Kube, spec: PeerDiscoverySpec) -> None:
        self.spec = spec
        if spec.service:
            source = ResourceWatch(
                kube, "discovery.k8s.io", "v1", "endpointslices", spec.namespace,
                label_selector=f"{SERVICE_LABEL}={spec.service}",
            )  # fmt: skip
            self._of = slice_peers
        else:
            selector = ",".join(f"{k}={v}" for k, v in sorted(spec.selector.items()))
            source = ResourceWatch(kube, "", "v1", "pods", spec.namespace, label_selector=selector)
            self._of = pod_peers
        self.reflector = Reflector("peers", source, self)
        self._by_object: dict[str, frozenset[Peer]] = {}
        self._current: frozenset[Peer] = frozenset()
        self._changed = asyncio.Event()  # set and replaced on every change
        self._generation = 0
        self._synced = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KubernetesPeers:
        self._task = asyncio.create_task(self.reflector.run(), name="k8s-peers")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def current(self) -> frozenset[Peer]:
        return self._current

    # reflector handler -------------------------------------------------------------------
    def upsert(self, obj: Obj) -> None:
        self._by_object[object_key(obj)] = self._of(obj, self.spec)
        self._recompute()

    def delete(self, obj: Obj) -> None:
        self._by_object.pop(object_key(obj), None)
        self._recompute()

    def synced(self) -> None:
        self._synced = True
        self._recompute(force=True)

    def _recompute(self, *, force: bool = False) -> None:
        peers = frozenset().union(*self._by_object.values())
        if peers == self._current and not force:
            return
        if peers != self._current:
            log.info("k8s_peers", peers=sorted(p.endpoint() for p in peers), count=len(peers))
        self._current = peers
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    # PeerSource ----------------------------------------------------------------------------
    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        last: frozenset[Peer] | None = None
        seen = -1
        while True:
            if not self._synced or self._generation == seen:
                await self._changed.wait()
                continue
            seen = self._generation
            if self._current != last:
                last = self._current
                yield tuple(sorted(last))


class K8sPeerDiscoveryParams(PluginParams):
    service: str = ""
    selector: dict[str, str] = Field(default_factory=dict)
    port_name: str = DEFAULT_PORT_NAME
    namespace: str = ""


class K8sPeerDiscovery(PluginBase):
    """Finds the EPP's peer replicas in Kubernetes.  Type ``k8s-peer-discovery``.

    Referenced by llm-d's ``dataLayer.peerDiscovery.pluginRef``.  Parameters: ``service`` (watch
    its EndpointSlices) or ``selector`` (watch pods by these labels) — exactly one; ``portName``
    (default ``peer``): the named port peers sync on; ``namespace`` (default: the EPP's own).
    ``source(kube, env)`` makes the ``KubernetesPeers`` watch, leaving out this pod by
    ``POD_IP``/``POD_NAME``.
    """

    TYPE: ClassVar[str] = "k8s-peer-discovery"
    PARAMS: ClassVar[type[PluginParams]] = K8sPeerDiscoveryParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        assert isinstance(params, K8sPeerDiscoveryParams)
        super().__init__(name or self.TYPE, params, handle)
        if bool(params.service) == bool(params.selector):
            raise ConfigError(f"{self.TYPE}: set exactly one of parameters service and selector")
        if not params.port_name:
            raise ConfigError(f"{self.TYPE}: parameter portName must not be empty")
        self.params = params

    def spec(self, env: Mapping[str, str]) -> PeerDiscoverySpec:
        p = self.params
        return PeerDiscoverySpec(
            namespace=p.namespace or env.get("NAMESPACE", "") or "default",
            service=p.service,
            selector=p.selector,
            port_name=p.port_name,
            self_ip=env.get("POD_IP", ""),
            self_name=env.get("POD_NAME", ""),
        )

    def source(self, kube: Kube, env: Mapping[str, str]) -> KubernetesPeers:
        return KubernetesPeers(kube, self.spec(env))
