"""One gRPC client-streaming call over one HTTP/2 connection, written from the event loop.

What a replica uses to publish its sync batches to a peer's sync server (``epp.server.peering``):
the client preface and SETTINGS, one stream at a time whose request messages leave as DATA
frames paced by the server's flow-control windows, and the frames a server sends a client
answered (SETTINGS, PING) or obeyed (WINDOW_UPDATE, GOAWAY, RST_STREAM, trailers).  The server
sends no response messages on such a call; a DATA frame is credited back and dropped.  When the
server ends or resets the call (a message it refused), the next message opens a new stream on
the same connection.

Why our own client: a message is one ``transport.write`` on the loop (uvloop writes at once),
with no thread between the loop and the socket.  ZMQ's I/O thread cost a wake of a second thread
on each side per message (docs/decisions.md, "Sync over the EPP's own HTTP/2").  The server side
is the EPP's own hardened HTTP/2 server, so a hostile peer meets the ext_proc port's limits.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Final

from epp.server.h2.frames import (
    ACK,
    DATA,
    DATA_HEADER,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    SETTINGS_ACK_FRAME,
    TYPE_FLAGS_ID,
    U32,
    WINDOW_UPDATE,
    frame,
    hpack_literal,
)

CLIENT_SETTINGS: Final = PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", S_ENABLE_PUSH, 0))
LAST_STREAM_ID: Final = 0x7FFFFFFF
MESSAGE_PREFIX: Final = struct.Struct(">BI")  # gRPC: compressed flag, length


def request_headers(path: bytes, authority: bytes, authorization: bytes = b"") -> bytes:
    """A gRPC request's header block: static-table entries and literals, no dynamic table;
    ``authorization`` (when given) as a never-indexed literal, so no proxy keeps it in a table."""
    return (
        b"\x83"  # :method POST (static 3)
        + b"\x86"  # :scheme http (static 6)
        + b"\x04" + hpack_literal(path)  # :path, name static 4, literal value without indexing
        + b"\x01" + hpack_literal(authority)  # :authority (static 1)
        + b"\x0f\x10" + hpack_literal(b"application/grpc")  # content-type (static 31)
        + b"\x00" + hpack_literal(b"te") + hpack_literal(b"trailers")
        + (b"\x1f\x08" + hpack_literal(authorization) if authorization else b"")  # static 23, never indexed
    )  # fmt: skip


class ClientProtocolError(Exception):
    """The server broke HTTP/2: the connection is closed."""


class StreamClient(asyncio.Protocol):
    """A connection carrying one client-streaming call to ``path``; ``send`` one message.

    Messages the windows cannot take yet, or that a server not reading would pile up in the
    socket's buffer (above the transport's high-water mark), wait in order: at most
    ``max_queued``; beyond that ``send`` refuses, as a ZMQ PUB at its high-water mark.
    ``closed`` resolves when the connection is gone; the owner reconnects with a new instance.
    """

    def __init__(
        self, path: bytes, authority: bytes, *, max_queued: int = 1000, authorization: bytes = b""
    ) -> None:
        self._block = request_headers(path, authority, authorization)
        self._max_queued = max_queued
        self._transport: asyncio.Transport | None = None
        self._tail = bytearray()  # a frame cut by the end of a read
        self._send_window = DEFAULT_WINDOW  # the connection's
        self._initial = DEFAULT_WINDOW  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self._max_frame = MAX_FRAME  # the server's SETTINGS_MAX_FRAME_SIZE
        self._sid = 0  # the open call's stream (0: none open)
        self._next_sid = 1
        self._stream_window = 0
        self._queue: deque[memoryview] = deque()  # whole gRPC messages (prefixed), the first maybe begun
        self._begun = False  # the first queued message is partly written on the open stream
        self._goaway = False
        self._paused = False  # the socket's buffer is above its high-water mark: the server does not read
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.calls = 0  # streams opened
        self.sent = 0  # messages written whole
        self.refused = 0  # messages refused (queue full, or not connected)

    # -- transport callbacks ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it
        self._transport.write(CLIENT_SETTINGS)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        """The server reads slower than we write: queue (bounded) instead of growing the buffer."""
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._queue.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._tail:
            data = bytes(self._tail) + data
            self._tail.clear()
        pos, end = 0, len(data)
        try:
            while end - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                if length > MAX_FRAME:  # we announce the default SETTINGS_MAX_FRAME_SIZE
                    raise ClientProtocolError("frame larger than SETTINGS_MAX_FRAME_SIZE")  # noqa: TRY301
                if pos + 9 + length > end:
                    break
                kind, flags, sid = TYPE_FLAGS_ID.unpack_from(data, pos + 3)
                self._on_frame(kind, flags, sid & LAST_STREAM_ID, data[pos + 9 : pos + 9 + length])
                pos += 9 + length
        except (ClientProtocolError, struct.error):
            self.close()
            return
        if pos < end:
            self._tail += data[pos:]
        self._pump()

    # -- sending -----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Open and taking messages (not after GOAWAY, nor once ``close`` began)."""
        transport = self._transport
        return transport is not None and not self._goaway and not transport.is_closing()

    @property
    def in_call(self) -> bool:
        """A call is open (the next message goes on it; else it opens one)."""
        return self._sid != 0

    def send(self, message: bytes) -> bool:
        """Write one request message now if the windows take it, else queue it; False: refused."""
        transport = self._transport
        if transport is None or self._goaway or transport.is_closing():  # closing: it would be lost
            self.refused += 1
            return False
        n = len(message) + 5
        if (
            not self._queue
            and not self._paused
            and self._sid
            and n <= min(self._stream_window, self._send_window, self._max_frame)
        ):
            self._stream_window -= n
            self._send_window -= n
            transport.write(DATA_HEADER.pack(n << 8 | DATA, 0, self._sid, 0, n - 5) + message)
            self.sent += 1
            return True
        if len(self._queue) >= self._max_queued:
            self.refused += 1
            return False
        self._queue.append(memoryview(MESSAGE_PREFIX.pack(0, len(message)) + message))
        self._pump()
        return True

    def _pump(self) -> None:
        """Write what the windows allow of the queued messages, opening a call when none is open."""
        transport = self._transport
        if transport is None or self._goaway or self._paused or not self._queue:
            return
        if not self._sid:
            self._open_call(transport)
            if not self._sid:
                return
        out: list[bytes] = []
        queue = self._queue
        while queue:
            room = min(self._stream_window, self._send_window)
            if room <= 0:
                break
            head = queue[0]
            chunk = head[: min(room, self._max_frame)]
            n = len(chunk)
            out.append(frame(DATA, 0, self._sid, bytes(chunk)))
            self._stream_window -= n
            self._send_window -= n
            if n == len(head):
                queue.popleft()
                self._begun = False
                self.sent += 1
            else:
                queue[0] = head[n:]
                self._begun = True
        if out:
            transport.write(b"".join(out))

    def _open_call(self, transport: asyncio.Transport) -> None:
        sid = self._next_sid
        if sid > LAST_STREAM_ID:  # every stream id spent: a new connection starts over
            self.close()
            return
        self._next_sid += 2
        self._sid = sid
        self._stream_window = self._initial
        self.calls += 1
        transport.write(frame(HEADERS, END_HEADERS, sid, self._block))

    def _call_over(self) -> None:
        """The server ended or reset the call: a message it had begun is lost with it."""
        self._sid = 0
        if self._begun:
            self._queue.popleft()
            self._begun = False

    # -- frames from the server ---------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ClientProtocolError("WINDOW_UPDATE of other than 4 bytes")
            inc = U32.unpack(payload)[0] & LAST_STREAM_ID
            if sid == 0:
                self._send_window += inc
                if self._send_window > MAX_WINDOW:
                    raise ClientProtocolError("connection window above 2^31-1")
            elif sid == self._sid:
                self._stream_window += inc
        elif kind == PING:
            if len(payload) != 8:
                raise ClientProtocolError("PING of other than 8 bytes")
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == HEADERS:
            if sid == self._sid and flags & END_STREAM:  # trailers (or trailers-only): the call is over
                self._call_over()
        elif kind == RST_STREAM:
            if sid == self._sid:
                self._call_over()
        elif kind == GOAWAY:
            self._goaway = True  # the server takes no new call: leave, the owner reconnects
            self.close()
        elif kind == DATA and payload:  # no response messages are expected: credit them and drop
            credit = U32.pack(len(payload))
            self._write(frame(WINDOW_UPDATE, 0, 0, credit) + frame(WINDOW_UPDATE, 0, sid, credit))
        # PUSH_PROMISE cannot come (ENABLE_PUSH 0); CONTINUATION and unknown types carry nothing we use

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ClientProtocolError("SETTINGS not a multiple of 6 bytes")
        for off in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ClientProtocolError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                if self._sid:
                    self._stream_window += value - self._initial
                self._initial = value
            elif key == S_MAX_FRAME_SIZE:
                self._max_frame = min(max(value, MAX_FRAME), 16_777_215)
        self._write(SETTINGS_ACK_FRAME)

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        """Close the connection; what is already written still leaves (the transport flushes)."""
        if self._transport is not None:
            self._transport.close()


class UnaryClient(StreamClient):
    """One unary call on its own connection: ``send`` the request, await ``response``.

    What a starting replica uses to take a peer's snapshot (``epp.server.peering``): the response
    message is gathered from the DATA frames, each credited back as it comes (so the server's
    windows never bind), up to ``max_response`` bytes; more, a broken prefix, or the connection
    gone before the trailers resolve ``response`` to None, as does a call that ends without a
    message (a refusal: the trailers are not decoded, only our own server is asked).
    """

    def __init__(
        self, path: bytes, authority: bytes, *, max_response: int, authorization: bytes = b""
    ) -> None:
        super().__init__(path, authority, max_queued=1, authorization=authorization)
        self._max_response = max_response
        self._body = bytearray()
        self.response: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if sid and sid == self._sid and not self.response.done():
            if kind == DATA:
                body = payload
                if flags & PADDED:
                    if not payload or payload[0] >= len(payload):
                        raise ClientProtocolError("DATA padding longer than the frame")
                    body = payload[1 : len(payload) - payload[0]]
                self._body += body
                if len(self._body) > self._max_response + 5:
                    self._finish(None)
                    self.close()
            elif kind == HEADERS and flags & END_STREAM:
                self._finish(self._message())
            elif kind == RST_STREAM:
                self._finish(None)
        super()._on_frame(kind, flags, sid, payload)

    def _message(self) -> bytes | None:
        body = self._body
        if len(body) < 5 or body[0] != 0 or U32.unpack_from(body, 1)[0] != len(body) - 5:
            return None
        return bytes(body[5:])

    def _finish(self, result: bytes | None) -> None:
        if not self.response.done():
            self.response.set_result(result)
        self._body = bytearray()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(None)
        super().connection_lost(exc)
