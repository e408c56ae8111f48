"""One HTTP/2 connection carrying gRPC calls: frames in, calls to handlers, frames out."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import TYPE_CHECKING

import hpack
import structlog

from epp.server.h2.calls import Call
from epp.server.h2.frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL,
    MAX_FRAME,
    MAX_MESSAGE_BYTES,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    RECV_WINDOW,
    RESOURCE_EXHAUSTED,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SERVER_SETTINGS,
    SETTINGS,
    SETTINGS_ACK_FRAME,
    TYPE_FLAGS_ID,
    U32,
    UNAVAILABLE,
    UNIMPLEMENTED,
    WINDOW_UPDATE,
    ConnectionError_,
    frame,
    unpad,
)

if TYPE_CHECKING:
    from epp.server.h2.server import H2GrpcServer

log = structlog.get_logger(__name__)
MAX_HEADER_BLOCK = 64 << 10  # bytes of one header block across CONTINUATION frames
Buffer = bytes | memoryview  # frames are memoryview slices of the read


class Connection(asyncio.Protocol):
    """One client connection: frames in, calls dispatched to handlers, frames out."""

    def __init__(self, server: H2GrpcServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
        self._header_cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._continuation: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._recv_unacked = 0
        self._goaway_sent = False
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self._window_waiters: list[asyncio.Future[None]] = []

    # -- transport callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it
        self._server.connections.add(self)
        self.write(SERVER_SETTINGS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        self._transport = None
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if call.driver is not None:
                call.driver.cancel()
        self._wake_window_waiters()

    def data_received(self, data: bytes) -> None:
        if self._buf:  # the tail of a frame cut by the last read: at most one frame, so bounded
            data = bytes(self._buf) + data
            self._buf.clear()
        if not self._preface:
            if len(data) < len(PREFACE):
                self._buf += data
                return
            if not data.startswith(PREFACE):
                self._close_with(PROTOCOL_ERROR)
                return
            data = data[len(PREFACE) :]
            self._preface = True
        view = memoryview(data)  # frames are sliced out of the read without copying
        pos = 0
        end = len(data)
        try:
            while end - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                if length > MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR)  # noqa: TRY301 - larger than we advertised
                if pos + 9 + length > end:
                    break
                kind, flags, sid = TYPE_FLAGS_ID.unpack_from(data, pos + 3)
                payload = view[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._on_frame(kind, flags, sid & 0x7FFFFFFF, payload)
                if self._transport is None:
                    return
        except ConnectionError_ as e:
            self._close_with(e.code)
            return
        if pos < end:
            self._buf += view[pos:]
        if self._recv_unacked >= RECV_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self._recv_unacked)))
            self._recv_unacked = 0

    def eof_received(self) -> bool | None:
        return None

    # -- frames -------------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: Buffer) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR)
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._on_headers(sid, flags, payload)
            else:
                self._continuation = (sid, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self._continuation is None or self._continuation[0] != sid:
                raise ConnectionError_(PROTOCOL_ERROR)
            self._continuation[2].extend(payload)
            if len(self._continuation[2]) > MAX_HEADER_BLOCK:
                raise ConnectionError_(PROTOCOL_ERROR)  # an endless CONTINUATION chain
            if flags & END_HEADERS:
                sid, first_flags, block = self._continuation
                self._continuation = None
                self._on_headers(sid, first_flags, bytes(block))
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == PING:
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            call = self._calls.pop(sid, None)
            if call is not None and call.driver is not None:
                call.driver.cancel()
        elif kind == GOAWAY:
            self._goaway_sent = True  # the client stops opening streams; let the open ones finish
        # PRIORITY, PUSH_PROMISE (never sent by clients) and unknown types are ignored (RFC 9113 §4.1)

    def _on_data(self, flags: int, sid: int, payload: Buffer) -> None:
        self._recv_unacked += len(payload)
        if flags & PADDED:
            payload = unpad(payload)
        call = self._calls.get(sid)
        if call is None:
            return  # a stream we reset or finished: its bytes still count for the connection window
        call.recv_unacked += len(payload)
        if call.recv_unacked >= RECV_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, sid, U32.pack(call.recv_unacked)))
            call.recv_unacked = 0
        buf = call.buf
        if buf:  # a message spread over frames: gather it (amortised appends)
            buf += payload
            data: Buffer = bytes(buf)
            buf.clear()
        else:
            data = payload  # the common case: whole messages in this frame, decoded in place
        pos = self._messages(call, data)
        if pos < 0:
            return  # the call ended (an error, or a reply that finished it)
        if pos < len(data):
            buf += data[pos:]
        if flags & END_STREAM:
            call.half_closed = True
            call.driver.on_end_stream()  # type: ignore[union-attr]

    def _messages(self, call: Call, data: Buffer) -> int:
        """Decode and deliver the whole gRPC messages in ``data``; how far it got, or -1 when the
        call is over."""
        pos, end = 0, len(data)
        decode, driver, calls = call.decode, call.driver, self._calls
        assert driver is not None
        while end - pos >= 5:
            if data[pos] != 0:
                self._fail_call(call, UNIMPLEMENTED, "compressed messages are not supported")
                return -1
            n = U32.unpack_from(data, pos + 1)[0]
            if n > MAX_MESSAGE_BYTES:
                self._fail_call(call, RESOURCE_EXHAUSTED, f"message of {n} bytes exceeds the limit")
                return -1
            if end - pos - 5 < n:
                break
            try:
                msg = decode(data[pos + 5 : pos + 5 + n])
            except Exception:
                self._fail_call(call, INTERNAL, "could not parse the request message")
                return -1
            pos += 5 + n
            driver.on_message(msg)
            if call.id not in calls:
                return -1
        return pos

    def _decode_headers(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """HPACK-decode ``block``, from a cache while the dynamic table stays as it was.

        A proxy opens every ext_proc stream with the same headers; Envoy sends them as the
        same bytes each time (indexed fields and literals without indexing), which leave
        the table untouched.  A block's meaning depends only on its bytes and the table, so
        a decode that did not change the table is cached until one that did; ``hpack`` in
        pure Python costs tens of µs per block, this is a dict lookup.
        """
        cache = self._header_cache
        headers = cache.get(block)
        if headers is not None:
            return headers
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (entries[0] if entries else None, len(entries), table.maxsize)  # holds the front entry
        try:
            decoded = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
        except Exception as e:
            raise ConnectionError_(COMPRESSION_ERROR) from e  # the HPACK state is lost
        front = entries[0] if entries else None
        if front is before[0] and len(entries) == before[1] and table.maxsize == before[2]:
            if len(cache) >= 64:
                cache.clear()
            cache[block] = decoded
        else:
            cache.clear()  # entries moved: cached blocks may mean something else now
        return decoded

    def _on_headers(self, sid: int, flags: int, block: Buffer) -> None:
        headers = self._decode_headers(bytes(block))
        call = self._calls.get(sid)
        if call is not None:  # trailers from the client end its half of the stream
            if flags & END_STREAM:
                call.half_closed = True
                call.driver.on_end_stream()  # type: ignore[union-attr]
            return
        if sid % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR)  # clients open odd-numbered streams
        if sid <= self._last_stream:
            return  # trailers of a stream already answered
        self._last_stream = sid
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        route = self._server.routes.get(path)
        if route is None or self._server.stopping:
            call = Call(self, sid, _no_decode)
            if route is None:
                call.finish(UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
            else:
                call.finish(UNAVAILABLE, "the server is shutting down")
            if not flags & END_STREAM:
                self.write(frame(RST_STREAM, 0, sid, U32.pack(NO_ERROR)))
            return
        decode, make_driver = route
        call = Call(self, sid, decode)
        self._calls[sid] = call
        call.driver = make_driver(call)
        if flags & END_STREAM:
            call.half_closed = True
            call.driver.on_end_stream()

    def end_call(self, call: Call, status: int, message: str = "") -> None:
        """Trailers for ``call``, once; a client still sending is told to stop (RST_STREAM)."""
        if self._calls.pop(call.id, None) is None:
            return
        if self._transport is None:
            return
        call.finish(status, message)
        if not call.half_closed:  # nobody reads the rest of the request any more
            self.write(frame(RST_STREAM, 0, call.id, U32.pack(NO_ERROR)))
        if self._goaway_sent and not self._calls:
            self._half_close()

    def _fail_call(self, call: Call, status: int, message: str) -> None:
        if call.driver is not None:
            call.driver.cancel()
        self.end_call(call, status, message)

    def _on_window_update(self, sid: int, payload: Buffer) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR)
        inc = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            self.send_window += inc
        else:
            call = self._calls.get(sid)
            if call is None:
                return
            call.send_window += inc
        self._wake_window_waiters()

    def _on_settings(self, payload: Buffer) -> None:
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR)
        for off in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > 0x7FFFFFFF:
                    raise ConnectionError_(FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ConnectionError_(PROTOCOL_ERROR)
                self.peer_max_frame = value
        self.write(SETTINGS_ACK_FRAME)
        self._wake_window_waiters()

    # -- output -------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write2(self, head: bytes, body: bytes) -> None:
        out = self._out
        out.append(head)
        out.append(body)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out))

    async def wait_window(self) -> None:
        if self._transport is None:
            raise asyncio.CancelledError
        waiter = self._loop.create_future()
        self._window_waiters.append(waiter)
        await waiter

    def _wake_window_waiters(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def goaway(self) -> None:
        """Tell the client to open no new streams; close once the open ones are done."""
        if self._transport is None:
            return
        self._goaway_sent = True
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(NO_ERROR)))
        if not self._calls:
            self._half_close()

    def _half_close(self) -> None:
        """Flush and send FIN; the peer closes once it has read everything (a close now could
        reset the connection and lose the replies still unread on the peer's side)."""
        self._flush()
        t = self._transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            with contextlib.suppress(OSError):  # the peer is already gone
                t.write_eof()

    def abort(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def _close_with(self, code: int) -> None:
        if self._transport is None:
            return
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(code)))
        self._flush()
        self._transport.close()


def _no_decode(data: bytes) -> None:
    return None  # a call refused at its headers reads nothing
