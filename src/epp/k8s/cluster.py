"""Everything the EPP does with an API server, started and stopped as one unit.

``async with Cluster(...)`` connects (a bad kubeconfig fails startup before anything listens),
starts the watches, competes for the lease when leader election is on, and offers the
/metrics authoriser.  On exit it releases the lease first, so a successor takes over while
this process drains, then stops the watches and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from epp.k8s.auth import MetricsAuthorizer
from epp.k8s.client import Kube
from epp.k8s.discovery import DiscoverySpec, KindSubscriber, KubernetesDiscovery
from epp.k8s.leader import LeaderElector, Timings, lease_name

log = structlog.get_logger(__name__)


def identity(env: Mapping[str, str]) -> str:
    """controller-runtime's ``<hostname>_<uuid>``: unique even if two processes share a pod name."""
    return f"{env.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


class Cluster:
    def __init__(
        self,
        spec: DiscoverySpec,
        *,
        kubeconfig: str = "",
        env: Mapping[str, str] = os.environ,
        leader_election: Timings | None = None,
        metrics_auth: bool = False,
        notification_sources: Sequence[KindSubscriber] = (),
    ) -> None:
        self.spec = spec
        self._kubeconfig = kubeconfig
        self._env = env
        self._timings = leader_election
        self._metrics_auth = metrics_auth
        self._sources = tuple(notification_sources)
        self.kube: Kube | None = None
        self.discovery: KubernetesDiscovery | None = None
        self.elector: LeaderElector | None = None
        self.authorizer: MetricsAuthorizer | None = None
        self._elect_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Load the client configuration (raises ConfigError); nothing runs yet."""
        self.kube = await Kube.connect(self._kubeconfig, self._env)

    async def start(self, datastore: Any) -> None:
        if self.kube is None:
            await self.connect()
        assert self.kube is not None
        self.discovery = KubernetesDiscovery(
            self.kube, datastore, self.spec, notification_sources=self._sources
        )
        await self.discovery.start()
        if self._timings is not None:
            name = self.spec.pool_name or self.spec.standalone_name
            self.elector = LeaderElector(
                self.kube,
                self.spec.namespace,
                lease_name(self.spec.namespace, name),
                identity(self._env),
                timings=self._timings,
            )
            self._elect_task = asyncio.create_task(self.elector.run(), name="k8s:leader-election")
        if self._metrics_auth:
            self.authorizer = MetricsAuthorizer(self.kube)

    def is_leader(self) -> bool:
        return self.elector.is_leader if self.elector is not None else True

    async def authorize(self, header: str, path: str) -> tuple[int, str]:
        assert self.authorizer is not None
        d = await self.authorizer.check(header, path)
        return d.status, d.reason

    async def release(self) -> None:
        """Stop competing and give the lease up (idempotent)."""
        if self._elect_task is not None:
            self._elect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elect_task
            self._elect_task = None
        if self.elector is not None:
            await self.elector.release()

    async def stop(self) -> None:
        await self.release()
        if self.discovery is not None:
            await self.discovery.stop()
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
