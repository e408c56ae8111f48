"""Run a ``SyncPlan``: the transport, the hub and the peer set, as one async context manager.

Entered by the app before it reports ready (the warm start happens inside ``__aenter__``),
exited after the ext_proc server has stopped so a draining replica keeps publishing until
its last request is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import structlog

from epp.sync.api import Transport
from epp.sync.assembly import SyncPlan
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer, PeerSource, StaticPeers, own_hosts, without_self
from epp.sync.secret import PeerSecret

log = structlog.get_logger(__name__)


def siblings(ports: frozenset[int]) -> Callable[[Peer], bool] | None:
    """Which peers are workers of this pod (None: it has none): a sibling listens on this host
    (a loopback or own address, as ``--workers`` lists them) on one of ``ports``; a peer on
    another pod's address with the same port is not one."""
    if not ports:
        return None
    hosts = own_hosts()
    return lambda p: p.port in ports and p.host in hosts


class PeerList(StaticPeers):
    """The configured peers minus this replica's own address (every replica may get one list)."""

    def __init__(self, port: int, peers: Iterable[Peer] = ()) -> None:
        self._port = port
        self._hosts = own_hosts()
        super().__init__(without_self(peers, port, self._hosts))

    def set(self, peers: Iterable[Peer]) -> None:
        super().set(without_self(peers, self._port, self._hosts))


class SyncService:
    """``async with SyncService(plan, peers, plugins) as hub``: bound, warm, running."""

    def __init__(
        self,
        plan: SyncPlan,
        peers: PeerSource,
        plugins: Iterable[Any],
        transport: Transport,
        sibling_ports: frozenset[int] = frozenset(),
        secret: PeerSecret | None = None,
    ) -> None:
        """``transport``: what ``plan.transport`` names, built by the app (``epp.server.peering.
        transport_for``); ``sibling_ports``: the sync ports of this pod's other workers (``--workers``);
        ``secret``: what peers must present (the transport checks their calls, the hub their
        snapshot requests; None: the port is open)."""
        self.plan = plan
        self.peers = peers
        self.hub = SyncHub(
            plan.replica_id,
            transport,
            interval=plan.interval,
            sibling=siblings(sibling_ports),
            timeout=plan.timeout,
            secret=secret,
        )
        self.hub.bind(plugins)

    async def __aenter__(self) -> SyncHub:
        port = self.hub.transport.bind()
        try:
            await self.hub.start(self.peers)
        except BaseException:
            await self.hub.stop()
            raise
        log.info(
            "sync_started",
            replica_id=self.plan.replica_id,
            port=port,
            peers=[p.id for p in self.peers.peers] if isinstance(self.peers, StaticPeers) else "discovered",
            shared=sorted(self.hub.plugins),
            interval=self.plan.interval or "per tick",
            transport=self.plan.transport,
            timeout=self.plan.timeout,
            authenticated=self._authenticated(),
        )
        return self.hub

    def _authenticated(self) -> str:
        """What a peer must authenticate for (the ``sync_started`` log says it once)."""
        if self.hub.secret is None:
            return "nothing: restrict the peer port to the EPP's pods (docs/scale-out.md)"
        if self.plan.transport == "zmq":
            return "snapshots only: ZMQ's PUB deltas can be read (not written) by anyone reaching the port"
        return "every call and snapshot"

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.hub.stop()
