"""One HTTP/2 connection carrying gRPC calls: frames in, calls to handlers, frames out."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import hpack
import structlog

from epp.server.h2.frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DATA_HEADER,
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
    OK,
    OK_TRAILERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    RECV_WINDOW,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEADERS,
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
    UNKNOWN,
    WINDOW_UPDATE,
    ConnectionError_,
    frame,
    trailers,
    unpad,
)

if TYPE_CHECKING:
    from epp.server.h2.server import H2GrpcServer

log = structlog.get_logger(__name__)


class GrpcError(Exception):
    """Ends a call with a non-OK grpc-status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Inbox:
    """The request messages of one call, as the async iterator a servicer reads."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()

    async def one(self) -> Any:
        """The single request of a unary call (None if the client sent none)."""
        async for msg in self:
            return msg
        return None

    def put(self, msg: Any) -> None:
        self._items.append(msg)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self._waiter = None


Handler = Callable[["Call"], Awaitable[None]]


class Call:
    """One HTTP/2 stream carrying one gRPC call."""

    __slots__ = (
        "_conn",
        "buf",
        "decode",
        "headers_sent",
        "id",
        "inbox",
        "recv_unacked",
        "send_window",
        "task",
        "window_waiter",
    )

    def __init__(self, conn: Connection, stream_id: int, decode: Callable[[bytes], Any]) -> None:
        self._conn = conn
        self.id = stream_id
        self.decode = decode
        self.inbox = Inbox()
        self.buf = bytearray()
        self.send_window = conn.peer_initial_window
        self.recv_unacked = 0
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None
        self.window_waiter: asyncio.Future[None] | None = None

    async def send(self, data: bytes) -> None:
        """One gRPC message (already serialised), respecting the peer's flow-control windows."""
        conn = self._conn
        if not self.headers_sent:
            self.headers_sent = True
            conn.write(frame(HEADERS, END_HEADERS, self.id, RESPONSE_HEADERS))
        n = len(data) + 5
        if n <= self.send_window and n <= conn.send_window and n <= conn.peer_max_frame:
            self.send_window -= n
            conn.send_window -= n
            conn.write2(DATA_HEADER.pack(n << 8 | DATA, 0, self.id, 0, n - 5), data)
            return
        view = memoryview(b"\x00" + U32.pack(n - 5) + data)
        while view:
            room = min(self.send_window, conn.send_window, conn.peer_max_frame, len(view))
            if room <= 0:
                await conn.wait_window(self)
                continue
            self.send_window -= room
            conn.send_window -= room
            conn.write(frame(DATA, 0, self.id, bytes(view[:room])))
            view = view[room:]

    def finish(self, status: int = OK, message: str = "") -> None:
        """Trailers (or a trailers-only response) ending the stream."""
        block = OK_TRAILERS if status == OK and not message else trailers(status, message)
        if not self.headers_sent:
            self.headers_sent = True
            block = RESPONSE_HEADERS + block
        self._conn.write(frame(HEADERS, END_HEADERS | END_STREAM, self.id, block))


class Connection(asyncio.Protocol):
    """One client connection: frames in, calls dispatched to handlers, frames out."""

    def __init__(self, server: H2GrpcServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
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
        for call in list(self._calls.values()):
            if call.task is not None:
                call.task.cancel()
        self._calls.clear()
        self._wake_window_waiters()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self._preface:
            if len(buf) < len(PREFACE):
                return
            if buf[: len(PREFACE)] != PREFACE:
                self._close_with(PROTOCOL_ERROR)
                return
            del buf[: len(PREFACE)]
            self._preface = True
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR)  # noqa: TRY301 - larger than we advertised
                if pos + 9 + length > end:
                    break
                kind, flags, sid = TYPE_FLAGS_ID.unpack_from(buf, pos + 3)
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._on_frame(kind, flags, sid & 0x7FFFFFFF, payload)
                if self._transport is None:
                    return
        except ConnectionError_ as e:
            self._close_with(e.code)
            return
        finally:
            if pos:
                del buf[:pos]
        if self._recv_unacked >= RECV_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self._recv_unacked)))
            self._recv_unacked = 0

    def eof_received(self) -> bool | None:
        return None

    # -- frames -------------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
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
                self.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            call = self._calls.pop(sid, None)
            if call is not None and call.task is not None:
                call.task.cancel()
        elif kind == GOAWAY:
            self._goaway_sent = True  # the client stops opening streams; let the open ones finish
        # PRIORITY, PUSH_PROMISE (never sent by clients) and unknown types are ignored (RFC 9113 §4.1)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
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
        buf += payload
        while len(buf) >= 5:
            n = U32.unpack_from(buf, 1)[0]
            if buf[0] != 0:
                self._fail_call(call, UNIMPLEMENTED, "compressed messages are not supported")
                return
            if n > MAX_MESSAGE_BYTES:
                self._fail_call(call, RESOURCE_EXHAUSTED, f"message of {n} bytes exceeds the limit")
                return
            if len(buf) < 5 + n:
                break
            data = bytes(buf[5 : 5 + n])
            del buf[: 5 + n]
            try:
                msg = call.decode(data)
            except Exception:
                self._fail_call(call, INTERNAL, "could not parse the request message")
                return
            call.inbox.put(msg)
        if flags & END_STREAM:
            call.inbox.close()

    def _on_headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except Exception as e:
            raise ConnectionError_(COMPRESSION_ERROR) from e  # the HPACK state is lost
        call = self._calls.get(sid)
        if call is not None:  # trailers from the client end its half of the stream
            if flags & END_STREAM:
                call.inbox.close()
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
        decode, handler = route
        call = Call(self, sid, decode)
        self._calls[sid] = call
        if flags & END_STREAM:
            call.inbox.close()
        call.task = self._loop.create_task(self._run(call, handler))

    async def _run(self, call: Call, handler: Handler) -> None:
        server = self._server
        server.active += 1
        server.idle.clear()
        try:
            await handler(call)
            status, message = OK, ""
        except GrpcError as e:
            status, message = e.status, e.message
        except asyncio.CancelledError:
            return  # the client reset the stream or went away: nothing to answer
        except Exception as e:
            log.exception("grpc_handler_crashed", error=repr(e))
            status, message = UNKNOWN, "internal error"
        finally:
            server.active -= 1
            if server.active == 0:
                server.idle.set()
        if self._calls.pop(call.id, None) is not None and self._transport is not None:
            call.finish(status, message)
            if not call.inbox.closed:  # the client may stop sending: nobody reads it any more
                self.write(frame(RST_STREAM, 0, call.id, U32.pack(NO_ERROR)))
            if self._goaway_sent and not self._calls:
                self._half_close()

    def _fail_call(self, call: Call, status: int, message: str) -> None:
        self._calls.pop(call.id, None)
        if call.task is not None:
            call.task.cancel()
        call.finish(status, message)
        self.write(frame(RST_STREAM, 0, call.id, U32.pack(NO_ERROR)))

    def _on_window_update(self, sid: int, payload: bytes) -> None:
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

    def _on_settings(self, payload: bytes) -> None:
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

    async def wait_window(self, call: Call) -> None:
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
    return None
