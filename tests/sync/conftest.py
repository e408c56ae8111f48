"""Hubs on loopback ports in one process, each sharing one ``RoutedCounter``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from epp.server.peering import transport_for
from epp.sync.hub import DEFAULT_HOLD, DEFAULT_READ_GAP, SyncHub
from epp.sync.peers import Peer
from epp.sync.secret import PeerSecret
from epp.sync.service import PeerList
from epp.testing.replicated import RoutedCounter, make_counter
from epp.testing.waiting import until


@dataclass(slots=True)
class Node:
    hub: SyncHub
    counter: RoutedCounter
    peers: PeerList

    @property
    def id(self) -> str:
        return self.hub.replica_id

    @property
    def peer(self) -> Peer:
        return Peer(id=self.id, host="127.0.0.1", port=self.hub.transport.port)


def make_node(
    replica_id: str,
    *,
    port: int = 0,
    timeout: float = 0.3,
    warm_start_timeout: float = 0.5,
    hwm: int = 1000,
    max_message_bytes: int = 1 << 20,
    interval: float = 0.0,
    hold: float = DEFAULT_HOLD,
    read_gap: float = DEFAULT_READ_GAP,
    kind: str = "zmq",
    secret: PeerSecret | None = None,
) -> Node:
    """A hub bound on 127.0.0.1 (``port`` 0: a free pair), not started; ``kind``: its transport;
    ``secret``: what its peers must present (and it presents)."""
    transport = transport_for(
        kind, "127.0.0.1", port, hwm=hwm, max_message_bytes=max_message_bytes, secret=secret
    )
    hub = SyncHub(
        replica_id,
        transport,
        timeout=timeout,
        warm_start_timeout=warm_start_timeout,
        interval=interval,
        hold=hold,
        read_gap=read_gap,
        secret=secret,
    )
    counter = make_counter()
    hub.bind([counter])
    bound = transport.bind()
    return Node(hub, counter, PeerList(bound))


@contextlib.asynccontextmanager
async def mesh(
    names: Sequence[str], kind: str = "zmq", secrets: Sequence[PeerSecret | None] = (), **kw: float
) -> AsyncIterator[list[Node]]:
    """Every node peers with every other (all listed, itself too: dropped by id), started together;
    ``secrets``: each node's, in order (none by default)."""
    mine = list(secrets) or [None] * len(names)
    nodes = [make_node(n, kind=kind, secret=s, **kw) for n, s in zip(names, mine, strict=True)]  # type: ignore[arg-type]
    everyone = [n.peer for n in nodes]
    for n in nodes:
        n.peers.set(everyone)
    try:
        await asyncio.gather(*(n.hub.start(n.peers) for n in nodes))
        # settled: every node heard every other, and the resyncs a first hearing asks for are out
        await until(lambda: all(_settled(n, len(nodes) - 1) for n in nodes), 5, what="the mesh settled")
        yield nodes
    finally:
        await asyncio.gather(*(n.hub.stop() for n in nodes if n.hub.serving))


def _settled(node: Node, peers: int) -> bool:
    """Heard every peer, and the resync a first hearing asks for done both ways: its own asks
    sent, the peers' asks answered (a resend each), nothing scheduled."""
    hub = node.hub
    answered = hub.stats.resends >= (1 if peers else 0) and hub._resend_timer is None
    return hub.connected == peers and answered and not hub._resync_wanted and hub._scheduled is None


@pytest.fixture(params=["h2", "zmq"])
def kind(request: pytest.FixtureRequest) -> str:
    """The transport a test's hubs use: the behaviour the hub promises holds on both."""
    return str(request.param)
