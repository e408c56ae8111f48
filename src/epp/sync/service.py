"""Run a ``SyncPlan``: the transport, the hub and the peer set, as one async context manager.

Entered by the app before it reports ready (the warm start happens inside ``__aenter__``),
exited after the ext_proc server has stopped so a draining replica keeps publishing until
its last request is done.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final

import structlog

from epp.errors import ConfigError
from epp.sync.assembly import SyncPlan
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer, PeerSource, StaticPeers, own_hosts, without_self
from epp.sync.transport import ZmqTransport

log = structlog.get_logger(__name__)

# Set by the --workers supervisor: ``<index>,<count>,<stride>`` — this process is worker
# ``index`` of ``count``, worker *j*'s sync port is ``stride * j`` past worker 0's.
SIBLINGS_ENV: Final = "EPP_SYNC_SIBLINGS"


def siblings(env: Mapping[str, str], port: int) -> Callable[[Peer], bool] | None:
    """Which peers are workers of this pod (``SIBLINGS_ENV``; None outside a supervised pod).

    A sibling listens on this host (a loopback or own address, as ``--workers`` lists them) on
    worker *j*'s port; a peer on another pod's address with the same port is not one.
    """
    raw = env.get(SIBLINGS_ENV)
    if not raw:
        return None
    try:
        index, count, stride = (int(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError(f"{SIBLINGS_ENV}: expected <index>,<count>,<stride>, got {raw!r}") from None
    if not 0 <= index < count or stride <= 0:
        raise ConfigError(f"{SIBLINGS_ENV}: index {index} outside 0..{count - 1} or stride {stride} <= 0")
    base = port - stride * index
    ports = frozenset(base + stride * j for j in range(count) if j != index)
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

    def __init__(self, plan: SyncPlan, peers: PeerSource, plugins: Iterable[Any]) -> None:
        self.plan = plan
        self.peers = peers
        self.hub = SyncHub(
            plan.replica_id,
            ZmqTransport(plan.bind_host, plan.port),
            interval=plan.interval,
            sibling=siblings(os.environ, plan.port),
            timeout=plan.timeout,
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
            timeout=self.plan.timeout,
        )
        return self.hub

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.hub.stop()
