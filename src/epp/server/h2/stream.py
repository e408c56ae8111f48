"""One HTTP/2 stream as its connection sees it: flow-control windows, credit, what it holds.

The connection knows nothing of what a stream carries.  It hands a stream's DATA to
``receive`` and its end to ``on_end_stream``, and calls ``cancel`` when the stream is dropped
(reset, refused, the connection gone); a subclass (``epp.server.h2.calls.Call``, one gRPC
call) gives those meaning.  Credit follows consumption: bytes the application has read are
``recv_unacked`` and go back to the peer as WINDOW_UPDATE; bytes it keeps for later
(``held``, queued messages) and the start of an unfinished message (``pending``) are not
credited until they are read, which is what bounds a peer that sends faster than we read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.server.h2.connection import Connection
    from epp.server.h2.frames import Buffer


class H2Stream:
    """The per-stream state of RFC 9113 §5.1 and §6.9 that one open stream needs."""

    __slots__ = ("buffered", "conn", "ended", "half_closed", "headers_sent", "held", "held_cost", "id",
                 "pending", "recv_unacked", "recv_window", "send_window")  # fmt: skip

    def __init__(self, conn: Connection, stream_id: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.send_window = conn.peer_initial_window
        self.recv_window = conn.stream_window  # what the peer may still send on this stream
        self.recv_unacked = 0  # bytes read and consumed, not yet credited to the peer
        self.pending = 0  # bytes of an unfinished message, credited once it is whole and read
        self.held = 0  # bytes delivered but queued by the application, credited once it reads them
        self.held_cost = 0  # what ``held`` costs in memory (the bytes and the decoded messages)
        self.buffered = 0  # what this stream counts in ``conn.buffered``
        self.headers_sent = False  # our response headers are out: a reset now is no rapid reset
        self.half_closed = False  # the peer ended its side (END_STREAM)
        self.ended = False  # answered to the end, or dropped: the connection forgot it

    def receive(self, payload: Buffer) -> int:
        """Take the DATA payload (padding removed): -1 if the stream ended meanwhile, 1 if bytes
        were consumed (the connection's empty-frame count starts over), 0 if only gathered."""
        raise NotImplementedError

    def on_end_stream(self) -> None:
        """The peer ended its side (``half_closed`` is already set)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """The stream is dropped without an answer: stop whatever works for it."""
        raise NotImplementedError
