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
        yield nodes
    finally:
        await asyncio.gather(*(n.hub.stop() for n in nodes if n.hub.serving))


@pytest.fixture(params=["h2", "zmq"])
def kind(request: pytest.FixtureRequest) -> str:
    """The transport a test's hubs use: the behaviour the hub promises holds on both."""
    return str(request.param)
