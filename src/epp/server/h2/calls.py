"""gRPC on HTTP/2: one call per stream, its messages de-framed and framed, its status, its route.

A request's ``:path`` picks a route (``open_call``): a decoder for its request messages and a
``Driver`` that answers them (``epp.server.h2.drivers``).  A call reads length-prefixed
messages out of its stream's DATA (uncompressed only, at most ``max_message_bytes`` each),
writes its replies as DATA frames paced by the peer's windows, and ends with trailers carrying
a grpc-status.  Refusals (no such method, shutting down, headers too large) are
trailers-only responses; the connection never sees a call it refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from epp.server.h2.frames import (
    DATA,
    DATA_HEADER,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INTERNAL,
    OK,
    OK_TRAILERS,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEADERS,
    U32,
    UNAUTHENTICATED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    frame,
    trailers,
)
from epp.server.h2.stream import H2Stream

if TYPE_CHECKING:
    from epp.server.h2.connection import Connection
    from epp.server.h2.frames import Buffer
    from epp.server.h2.headers import HeaderList
    from epp.server.h2.limits import H2Limits

QUEUED_MESSAGE_COST = 256  # what a decoded message waiting for a busy call costs beyond its bytes


class Driver(Protocol):
    """What answers one call's messages (``epp.server.h2.drivers``)."""

    def on_message(self, msg: Any) -> bool:
        """Take one request message; True if it was queued, not yet read (it is credited to the
        peer's window when ``Connection.release`` says it was)."""
        ...

    def on_end_stream(self) -> None: ...
    def cancel(self) -> None:
        """The client reset the stream or the connection is gone: stop, answer nothing."""
        ...


Decode = Callable[[Any], Any]
Route = tuple[Decode, Callable[["Call"], Driver]]  # a method's request decoder and driver factory


class Call(H2Stream):
    """One gRPC call on one HTTP/2 stream."""

    __slots__ = ("decode", "driver", "partial", "partial_size")

    def __init__(self, conn: Connection, stream_id: int, decode: Decode) -> None:
        super().__init__(conn, stream_id)
        self.decode = decode
        self.partial = bytearray()  # the start of a message spread over DATA frames
        self.partial_size = 0  # the length of that message with its prefix, once the prefix is in
        self.driver: Driver | None = None

    # -- requests in ----------------------------------------------------------------------
    def receive(self, payload: Buffer) -> int:
        """Gather ``payload`` and deliver the whole gRPC messages it completes to the driver.

        Delivered messages are credited to the peer unless the driver queued them (``held``);
        the start of an unfinished message stays in ``partial`` (``pending``).  One method for
        both, because it runs once per DATA frame.
        """
        partial = self.partial
        data: Buffer = payload
        if partial:  # a message spread over frames: gather it, decode it once it is whole
            partial += payload
            if not self.partial_size and len(partial) >= 5 and self._check_prefix(partial, 0) < 0:
                return -1
            if not self.partial_size or len(partial) < self.partial_size:
                self.pending = len(partial)
                return 0
            data = bytes(partial)
            partial.clear()
        elif not data:
            return 0
        pos, end = 0, len(data)
        decode, driver = self.decode, self.driver
        assert driver is not None
        limit = self.conn.limits.max_message_bytes
        held = self.held
        while end - pos >= 5:
            if data[pos] != 0:
                self.fail(UNIMPLEMENTED, "compressed messages are not supported")
                return -1
            n = U32.unpack_from(data, pos + 1)[0]
            if n > limit:
                self._check_prefix(data, pos)
                return -1
            if end - pos - 5 < n:
                self.partial_size = 5 + n
                break
            try:
                msg = decode(data[pos + 5 : pos + 5 + n])
            except Exception:
                self.fail(INTERNAL, "could not parse the request message")
                return -1
            pos += 5 + n
            if driver.on_message(msg):  # queued behind a busy call: credited when it is read
                self.held += 5 + n
                self.held_cost += 5 + n + QUEUED_MESSAGE_COST
            if self.ended:
                return -1
        else:
            self.partial_size = 0
        self.recv_unacked += pos - (self.held - held)
        if pos < end:
            partial += data[pos:]
            self.pending = len(partial)
        elif self.pending:
            self.pending = 0
        return 1

    def _check_prefix(self, data: Buffer, pos: int) -> int:
        """The length of the message whose prefix is at ``pos``; -1 (the call failed) if refused."""
        if data[pos] != 0:
            self.fail(UNIMPLEMENTED, "compressed messages are not supported")
            return -1
        n: int = U32.unpack_from(data, pos + 1)[0]
        limit = self.conn.limits.max_message_bytes
        if n > limit:
            self.fail(RESOURCE_EXHAUSTED, f"received message larger than max ({n} vs. {limit})")
            return -1
        self.partial_size = 5 + n
        return n

    def on_end_stream(self) -> None:
        if self.partial:
            self.fail(INTERNAL, "the stream ended inside a message")
            return
        self.driver.on_end_stream()  # type: ignore[union-attr]

    # -- replies out ----------------------------------------------------------------------
    def send_nowait(self, data: bytes) -> bool:
        """Write one gRPC message if the peer's windows take it whole in one frame; else False."""
        conn = self.conn
        n = len(data) + 5
        if n > self.send_window or n > conn.send_window or n > conn.peer_max_frame or conn.write_paused:
            return False
        self._open_response()
        self.send_window -= n
        conn.send_window -= n
        conn.write_frame(DATA_HEADER.pack(n << 8 | DATA, 0, self.id, 0, n - 5), data)
        return True

    async def send(self, data: bytes) -> None:
        """One gRPC message, split into frames and paced by the peer's flow-control windows."""
        if self.send_nowait(data):
            return
        conn = self.conn
        self._open_response()
        view = memoryview(b"\x00" + U32.pack(len(data)) + data)
        while view:
            room = min(self.send_window, conn.send_window, conn.peer_max_frame, len(view))
            if room <= 0 or conn.write_paused:  # the peer's windows are full, or it does not read
                await conn.wait_window()
                continue
            self.send_window -= room
            conn.send_window -= room
            conn.write(frame(DATA, 0, self.id, bytes(view[:room])))
            view = view[room:]

    def _open_response(self) -> None:
        """Response headers, once, before the first message."""
        if not self.headers_sent:
            self.headers_sent = True
            self.conn.write(frame(HEADERS, END_HEADERS, self.id, RESPONSE_HEADERS))

    # -- the end --------------------------------------------------------------------------
    def end(self, status: int = OK, message: str = "") -> None:
        """Trailers with ``status``, once (the call is then over); a client still sending is told
        to stop."""
        block = OK_TRAILERS if status == OK and not message else trailers(status, message)
        if not self.headers_sent:
            block = RESPONSE_HEADERS + block  # a trailers-only response
        self.conn.end_stream(self, block)

    def fail(self, status: int, message: str) -> None:
        """The request broke gRPC's rules: the driver stops and the call ends with ``status``."""
        self.cancel()
        self.end(status, message)

    def cancel(self) -> None:
        if self.driver is not None:
            self.driver.cancel()


def open_call(
    conn: Connection,
    stream_id: int,
    headers: HeaderList,
    size: int,
    routes: dict[bytes, Route],
    limits: H2Limits,
    *,
    stopping: bool,
    denied: bool = False,
) -> Call | None:
    """The call a new stream's ``headers`` ask for, its driver attached; or None when it is refused,
    the refusal already written (a trailers-only response with its grpc-status).  ``denied``: the
    caller found the headers may not open a call at all (UNAUTHENTICATED)."""
    path = b""
    for name, value in headers:
        if name == b":path":
            path = value
            break
    route = routes.get(path)
    if route is None or stopping or size > limits.max_header_list_bytes or denied:
        if size > limits.max_header_list_bytes:
            status = RESOURCE_EXHAUSTED
            message = f"header list of {size} bytes exceeds {limits.max_header_list_bytes}"
        elif denied:
            status, message = UNAUTHENTICATED, "a sync peer must present a shared secret"
        elif route is None:
            status, message = UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}"
        else:
            status, message = UNAVAILABLE, "the server is shutting down"
        block = RESPONSE_HEADERS + trailers(status, message)
        conn.write(frame(HEADERS, END_HEADERS | END_STREAM, stream_id, block))
        return None
    decode, make_driver = route
    call = Call(conn, stream_id, decode)
    call.driver = make_driver(call)
    return call
