"""One gRPC call on an HTTP/2 stream, and the two ways of driving it.

``TaskDriver`` runs a coroutine handler that reads an async iterator (health checks).
``SessionDriver`` feeds each message to an ext_proc session (``epp.server.stream.Stream``)
from the connection's read callback and writes the replies at once, falling back to a task
only while the session routes a request body (``route_pending``: ``await route()``) or the
peer's window is full: a response chunk then costs no task switch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from epp.server.h2.frames import (
    DATA,
    DATA_HEADER,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INTERNAL,
    OK,
    OK_TRAILERS,
    RESPONSE_HEADERS,
    U32,
    UNKNOWN,
    frame,
    trailers,
)

if TYPE_CHECKING:
    from epp.server.h2.connection import Connection

log = structlog.get_logger(__name__)


class GrpcError(Exception):
    """Ends a call with a non-OK grpc-status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Driver(Protocol):
    def on_message(self, msg: Any) -> bool:
        """Take one request message; True if it was queued, not yet read (it is credited to the
        peer's window when ``Connection.release`` says it was)."""
        ...

    def on_end_stream(self) -> None: ...
    def cancel(self) -> None:
        """The client reset the stream or the connection is gone: stop, answer nothing."""
        ...


class Call:
    """One HTTP/2 stream carrying one gRPC call."""

    __slots__ = ("buf", "buffered", "conn", "decode", "driver", "half_closed", "headers_sent", "held",
                 "held_cost", "id", "need", "recv_unacked", "recv_window", "send_window")  # fmt: skip

    def __init__(self, conn: Connection, stream_id: int, decode: Callable[[Any], Any]) -> None:
        self.conn = conn
        self.id = stream_id
        self.decode = decode
        self.buf = bytearray()  # the start of a message spread over DATA frames
        self.need = 0  # the length of that message with its prefix, once the prefix is in
        self.send_window = conn.peer_initial_window
        self.recv_window = conn.stream_window  # what the peer may still send on this stream
        self.recv_unacked = 0  # bytes read, not yet credited to the peer
        self.held = 0  # bytes of messages the driver queued, credited once it reads them
        self.held_cost = 0
        self.buffered = 0  # what this call counts in ``conn.buffered``
        self.headers_sent = False
        self.half_closed = False  # the client ended its side
        self.driver: Driver | None = None

    def send_nowait(self, data: bytes) -> bool:
        """Write one gRPC message if the peer's windows take it whole in one frame; else False."""
        conn = self.conn
        n = len(data) + 5
        if n > self.send_window or n > conn.send_window or n > conn.peer_max_frame or conn.write_paused:
            return False
        self._open_response()
        self.send_window -= n
        conn.send_window -= n
        conn.write2(DATA_HEADER.pack(n << 8 | DATA, 0, self.id, 0, n - 5), data)
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

    def finish(self, status: int = OK, message: str = "") -> None:
        """Trailers (or a trailers-only response) ending the stream."""
        block = OK_TRAILERS if status == OK and not message else trailers(status, message)
        if not self.headers_sent:
            self.headers_sent = True
            block = RESPONSE_HEADERS + block
        self.conn.write(frame(HEADERS, END_HEADERS | END_STREAM, self.id, block))


class Inbox:
    """The request messages of one call, as the async iterator a handler reads."""

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

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self._waiter = None


Handler = Callable[[Call, Inbox], Awaitable[None]]


class TaskDriver:
    """A coroutine handler per call of a unary request; returning ends the call OK, ``GrpcError``
    with its status.  A second request message ends the call INTERNAL, as grpc-go does."""

    __slots__ = ("_call", "_inbox", "_messages", "_task")

    def __init__(self, call: Call, handler: Handler) -> None:
        self._call = call
        self._inbox = Inbox()
        self._messages = 0
        self._task = asyncio.get_running_loop().create_task(self._run(handler))

    def on_message(self, msg: Any) -> bool:
        self._messages += 1
        if self._messages > 1:
            self._task.cancel()
            self._call.conn.end_call(self._call, INTERNAL, "grpc: too many request messages for a unary call")
            return False
        self._inbox.put(msg)
        return False

    def on_end_stream(self) -> None:
        self._inbox.close()

    def cancel(self) -> None:
        self._task.cancel()

    async def _run(self, handler: Handler) -> None:
        try:
            await handler(self._call, self._inbox)
            status, message = OK, ""
        except GrpcError as e:
            status, message = e.status, e.message
        except asyncio.CancelledError:
            return  # the client reset the stream or went away: nothing to answer
        except Exception as e:
            log.exception("grpc_handler_crashed", error=repr(e))
            status, message = UNKNOWN, "internal error"
        self._call.conn.end_call(self._call, status, message)


class Session(Protocol):
    """What an ext_proc ``epp.server.stream.Stream`` offers a transport.

    ``handle`` answers at once; when it leaves ``route_pending`` set, the replies to that
    message come from ``await route()`` instead.
    """

    finished: bool
    route_pending: bool

    def handle(self, msg: Any) -> list[Any]: ...
    async def route(self) -> list[Any]: ...
    def close(self) -> None: ...


class SessionDriver:
    """An ext_proc session answered from the read callback whenever it can be."""

    __slots__ = ("_call", "_pending", "_serialize", "_session", "_task")

    def __init__(self, call: Call, session: Session, serialize: Callable[[Any], bytes]) -> None:
        self._call = call
        self._session = session
        self._serialize = serialize
        self._pending: deque[Any] = deque()
        self._task: asyncio.Task[None] | None = None  # set: it owns the call until nothing is pending

    def on_message(self, msg: Any) -> bool:
        if self._task is not None:
            self._pending.append(msg)
            return True
        session = self._session
        try:
            out = session.handle(msg)
        except Exception as e:  # a session answers its own errors; this is a bug, not a request's fault
            log.exception("ext_proc_call_crashed", error=repr(e))
            self._end(UNKNOWN, "internal error")
            return False
        if session.route_pending:
            self._go_slow(out)
        else:
            self._write(out)
        return False

    def on_end_stream(self) -> None:
        if self._task is None:
            self._end(OK)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._session.close()

    def _write(self, out: list[Any]) -> None:
        call, serialize = self._call, self._serialize
        for i, reply in enumerate(out):
            if not call.send_nowait(serialize(reply)):
                self._go_slow(out[i:])
                return
        if self._session.finished or call.half_closed:
            self._end(OK)

    def _go_slow(self, replies: list[Any]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._slow(replies))

    async def _slow(self, replies: list[Any]) -> None:
        """Own the call while routing awaits or the peer's window is full, then hand back."""
        session, call, serialize = self._session, self._call, self._serialize
        try:
            while True:
                for reply in replies:
                    await call.send(serialize(reply))
                if session.route_pending:
                    replies = await session.route()
                    continue
                if session.finished or not self._pending:
                    break
                replies = session.handle(self._pending.popleft())
        except asyncio.CancelledError:
            return
        except Exception as e:
            log.exception("ext_proc_call_crashed", error=repr(e))
            self._end(UNKNOWN, "internal error")
            return
        finally:
            self._task = None
            call.conn.release(call)  # what was queued meanwhile is read: the peer may send more
        if session.finished or call.half_closed:
            self._end(OK)

    def _end(self, status: int, message: str = "") -> None:
        self._session.close()
        self._call.conn.end_call(self._call, status, message)
