"""What the hub needs of a transport: ``Transport``, met by ZMQ (``epp.sync.transport``) and by the
EPP's own HTTP/2 (``epp.server.peering``, the default; the app picks one from the syncer's
``transport``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from epp.sync.peers import Peer

Frames = list[bytes]


class Transport(Protocol):
    """Moves frames between replicas; ``epp.sync.hub.SyncHub`` decides what they mean."""

    port: int
    max_message_bytes: int

    # reads that found messages, by what ran them (``SyncHub.debug_state``), and messages read
    @property
    def reads_woken(self) -> int: ...
    @property
    def reads_timer(self) -> int: ...
    @property
    def reads_riding(self) -> int: ...
    @property
    def reads_routing(self) -> int: ...
    @property
    def timer_wakes(self) -> int: ...
    @property
    def messages_read(self) -> int: ...

    # whether the ext_proc edge should call ``ride`` on every read (the loop is awake then)
    wants_rides: bool

    def bind(self) -> int:
        """Bind the sync port (ZMQ: and the snapshot port after it); returns the sync port."""
        ...

    def close(self, linger: float = 0.0) -> None:
        """Close everything; ``linger`` seconds for what is still queued (a goodbye) to leave."""
        ...

    def set_peers(self, peers: Iterable[Peer]) -> None: ...

    @property
    def has_peers(self) -> bool: ...

    @property
    def peers(self) -> tuple[Peer, ...]: ...

    def send(self, frame: bytes) -> bool:
        """Publish ``frame`` to every peer without blocking; False when a queue refused it."""
        ...

    def listen(self, handler: Callable[[list[Frames]], None], gap: float = 0.0) -> None:
        """From now on hand peers' messages to ``handler`` (``gap``: a busy receiver's least
        time between reads, where reading has a cost per read)."""
        ...

    def prompt(self) -> None:
        """The messages just handled were late: read the next ones at once."""
        ...

    def read_now(self) -> None:
        """The loop is awake anyway (the hub sent): read what is queued."""
        ...

    def ride(self) -> None:
        """The loop woke for a request: read what is queued if that saves a wake."""
        ...

    async def redial(self) -> None:
        """Keep peers' connections up until cancelled."""
        ...

    async def serve_snapshots(self, answer: Callable[[Frames], bytes | None]) -> None:
        """Answer warm-start requests until cancelled."""
        ...

    async def request_snapshot(
        self, peers: Iterable[Peer], request: bytes, accept: Callable[[Frames], bool], *, deadline: float
    ) -> bool:
        """Ask ``peers`` for a snapshot until ``accept`` takes one or ``deadline`` passes."""
        ...
