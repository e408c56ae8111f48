"""The two ways of answering a gRPC call's messages (a ``Driver``).

``TaskDriver`` runs a coroutine handler that reads an async iterator (health checks).
``SessionDriver`` feeds each message to an ext_proc session (``ExtProcSessionLike``,
``epp.server.session.ExtProcSession``) from the connection's read callback and writes the
replies at once, falling back to a task only while routing a request body waits
(``route_pending``: ``await route()``, started eagerly by ``eager.start``) or the peer's window
is full: a response chunk costs no task switch, and nor does a request that routes without
waiting (the common case).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from epp.server.h2 import eager
from epp.server.h2.calls import Call
from epp.server.h2.frames import INTERNAL, OK, UNKNOWN

log = structlog.get_logger(__name__)


class GrpcError(Exception):
    """Raised by a handler: ends its call with a non-OK grpc-status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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

    __slots__ = ("_call", "_inbox", "_received", "_task")

    def __init__(self, call: Call, handler: Handler) -> None:
        self._call = call
        self._inbox = Inbox()
        self._received = 0
        self._task = asyncio.get_running_loop().create_task(self._run(handler))

    def on_message(self, msg: Any) -> bool:
        self._received += 1
        if self._received > 1:
            self._task.cancel()
            self._call.end(INTERNAL, "grpc: too many request messages for a unary call")
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
        self._call.end(status, message)


class ExtProcSessionLike(Protocol):
    """What an ext_proc session (``epp.server.session.ExtProcSession``) offers a transport.

    ``handle`` answers at once; when it leaves ``route_pending`` set, the replies to that
    message come from ``await route()`` instead.
    """

    finished: bool
    route_pending: bool

    writer: Any  # set to the driver: ``write_unasked`` (epp.server.session.UnaskedWriter)

    def handle(self, msg: Any) -> list[Any]: ...
    async def route(self) -> list[Any]: ...
    def take_eviction(self) -> list[Any]: ...
    def close(self) -> None: ...


class SessionDriver:
    """An ext_proc session answered from the read callback whenever it can be.

    ``serialize`` turns a reply into bytes; a reply that is bytes already is written as it is.
    """

    __slots__ = ("_call", "_pending", "_routing", "_serialize", "_session", "_task")

    def __init__(self, call: Call, session: ExtProcSessionLike, serialize: Callable[[Any], bytes]) -> None:
        self._call = call
        self._session = session
        self._serialize = serialize
        self._pending: deque[Any] = deque()
        self._task: asyncio.Task[None] | None = None  # set: it owns the call until nothing is pending
        self._routing: asyncio.Task[list[Any]] | None = None  # routing that waited, until ``_task`` has it
        session.writer = self

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
            self._route(out)
        else:
            self._write(out)
        return False

    def on_end_stream(self) -> None:
        if self._task is None:
            self._end(OK)

    def write_unasked(self) -> None:
        """A reply the session has unasked (an evicted request's end): written now unless a task
        owns the call, which then writes it with the next message's replies."""
        if self._task is None and not self._call.ended:
            out = self._session.take_eviction()
            if out:
                self._write(out)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._routing is not None:  # ``_task`` may be cancelled before it ever awaited it
            self._routing.cancel()
        self._session.close()

    def _write(self, out: list[Any]) -> None:
        call, serialize = self._call, self._serialize
        for i, reply in enumerate(out):
            # Hot replies are hand-encoded bytes already: no serializer call for them.
            if not call.send_nowait(reply if reply.__class__ is bytes else serialize(reply)):
                self._hand_to_task(out[i:])
                return
        if self._session.finished or call.half_closed:
            self._end(OK)

    def _route(self, out: list[Any]) -> None:
        """Route the completed request body now; a task takes over only if routing waits."""
        started = eager.start(self._session.route(), self._call.conn.loop)
        if started.task is not None:
            self._routing = started.task
            self._hand_to_task(out, started.task)
            return
        try:
            replies = started.result()
        except (Exception, asyncio.CancelledError) as e:  # route() answers a request's errors: a bug
            log.exception("ext_proc_call_crashed", error=repr(e))
            self._end(UNKNOWN, "internal error")
            return
        self._write([*out, *replies] if out else replies)

    def _hand_to_task(self, replies: list[Any], routing: asyncio.Task[list[Any]] | None = None) -> None:
        self._task = self._call.conn.loop.create_task(self._run_as_task(replies, routing))

    async def _run_as_task(self, replies: list[Any], routing: asyncio.Task[list[Any]] | None = None) -> None:
        """Own the call while routing awaits or the peer's window is full, then hand back."""
        session, call, serialize = self._session, self._call, self._serialize
        try:
            if routing is not None:  # routing waited: its replies follow what is already due
                replies = [*replies, *await routing]
                self._routing = None
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
        self._call.end(status, message)
