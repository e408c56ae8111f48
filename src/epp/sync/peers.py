"""Who this replica's peers are: ``Peer`` and the sources that say so.

A peer is another EPP replica (or worker) whose sync port this one subscribes to.  Static
sources are ``--peers host:port,...`` and ``--peers-file PATH`` (one ``host:port`` a line,
``#`` comments; the app re-reads it with its file watcher and calls ``StaticPeers.set``).
Every replica is usually given the same list, so a replica drops its own address from it;
a replica that still reaches itself (a DNS name for its own IP) drops its own messages by
id in the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

from epp.errors import ConfigError


@dataclass(frozen=True, slots=True, order=True)
class Peer:
    """A peer's sync address; ``id`` is its ``host:port`` until its messages name its replica id."""

    id: str
    host: str
    port: int

    def endpoint(self, offset: int = 0) -> str:
        """Its ZMQ address: ``offset`` 0, its PUB (``--peer-transport=zmq``); 1, its snapshot socket."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port + offset}"


def parse_peer(text: str, where: str) -> Peer:
    """``host:port`` (``[v6]:port``) → Peer; a bad entry is a ConfigError naming ``where``."""
    entry = text.strip()
    host, sep, port_text = entry.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65535:
        raise ConfigError(f"{where}: invalid peer {entry!r}: expected HOST:PORT with a port in 1..65534")
    port = int(port_text)
    return Peer(id=f"{host}:{port}", host=host, port=port)


def parse_peers(text: str, where: str) -> tuple[Peer, ...]:
    """Entries separated by commas or lines; ``#`` starts a comment; duplicates collapse."""
    peers: dict[str, Peer] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.partition("#")[0]
        for entry in line.split(","):
            if entry.strip():
                peer = parse_peer(entry, f"{where} line {n}" if "\n" in text else where)
                peers.setdefault(peer.id, peer)
    return tuple(peers.values())


def own_hosts() -> frozenset[str]:
    """Names and addresses that mean this host, to drop our own entry from a shared list."""
    names = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", socket.gethostname()}
    if ip := os.environ.get("POD_IP"):
        names.add(ip)
    with contextlib.suppress(OSError):
        names.update(str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None))
    return frozenset(names)


def without_self(peers: Iterable[Peer], port: int, hosts: frozenset[str]) -> tuple[Peer, ...]:
    """``peers`` minus the entries that are this replica's own sync address."""
    return tuple(p for p in peers if not (p.port == port and p.host in hosts))


class PeerSource(Protocol):
    """An async stream of the current peer set: the first value at once, then each change."""

    def updates(self) -> AsyncIterator[tuple[Peer, ...]]: ...


class StaticPeers:
    """A fixed list, or a file's content re-set by the app's watcher when the file changes."""

    def __init__(self, peers: Iterable[Peer] = ()) -> None:
        self.peers = tuple(peers)
        self._changed = asyncio.Event()

    def set(self, peers: Iterable[Peer]) -> None:
        peers = tuple(peers)
        if peers != self.peers:
            self.peers = peers
            self._changed.set()

    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        while True:
            self._changed.clear()
            yield self.peers
            await self._changed.wait()


class UnionPeers:
    """Several sources as one: the union of their latest sets, yielded once every source has
    given its first (Kubernetes-discovered pods plus this pod's own workers)."""

    def __init__(self, *sources: PeerSource) -> None:
        self.sources = sources

    async def updates(self) -> AsyncGenerator[tuple[Peer, ...], None]:
        latest: list[tuple[Peer, ...] | None] = [None] * len(self.sources)
        changed = asyncio.Event()

        async def follow(i: int, source: PeerSource) -> None:
            async for peers in source.updates():
                latest[i] = peers
                changed.set()

        tasks = [asyncio.create_task(follow(i, s), name=f"peers-{i}") for i, s in enumerate(self.sources)]
        last: tuple[Peer, ...] | None = None
        try:
            while True:
                await changed.wait()
                changed.clear()
                if any(x is None for x in latest):
                    continue
                union = tuple(sorted({p for x in latest if x is not None for p in x}))
                if union != last:
                    last = union
                    yield union
        finally:
            for t in tasks:
                t.cancel()


class PodWorkers:
    """Each discovered pod as its ``count`` workers: worker *j* syncs on the pod's peer port +
    2*j* (the port and the snapshot port after it, per worker; ``epp.workers``).  Pods of one
    Deployment share their CPU limit and so their worker count: this one's is used."""

    def __init__(self, source: PeerSource, count: int) -> None:
        self.source = source
        self.count = count

    async def updates(self) -> AsyncGenerator[tuple[Peer, ...], None]:
        async for peers in self.source.updates():
            yield tuple(
                Peer(id=p.id if j == 0 else f"{p.id}-w{j}", host=p.host, port=p.port + 2 * j)
                for p in peers
                for j in range(self.count)
            )
