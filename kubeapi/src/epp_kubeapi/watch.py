"""One watch stream: newline-delimited JSON events over a chunked 200 response.

Event conversion follows the apiserver's watch cache (``cacheWatcher.convertToWatchEvent``):
an object that stops matching the watcher's filter arrives as DELETED (its previous state,
at the event's resourceVersion) and one that starts matching arrives as ADDED. Bookmarks
carry the global resourceVersion only after every earlier queued event has been written,
so a client resuming from a bookmark never skips an event.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from .resources import Resource
from .status import ApiError
from .store import End, Event, Obj, ObjectStore, Subscription

Filter = Callable[[Obj], bool]


@dataclass(frozen=True, slots=True)
class WatchParams:
    """The query parameters that shape a watch."""

    since: int | None  # None: start with synthetic ADDED events for the current state
    bookmarks: bool
    timeout: float | None
    initial_events_end: bool  # sendInitialEvents=true: mark the end of the initial ADDEDs with a bookmark


def convert(event: Event, passes: Filter) -> tuple[str, Obj] | None:
    """The event this watcher sees, or None: the watch cache's transition rules."""
    cur = event.type != "DELETED" and passes(event.obj)
    old = event.prev is not None and passes(event.prev)
    if cur and not old:
        return "ADDED", event.obj
    if cur and old:
        return "MODIFIED", event.obj
    if old and event.prev is not None:
        prev = copy.deepcopy(event.prev)
        prev["metadata"]["resourceVersion"] = str(event.rv)
        return "DELETED", prev
    return None


def bookmark(resource: Resource, rv: int, annotations: dict[str, str] | None = None) -> Obj:
    md: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
    if annotations:
        md["annotations"] = annotations
    return {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": md}


class WatchStream:
    """Serves one watch request until timeout, an ``End``, the client leaving or a drop."""

    def __init__(
        self,
        store: ObjectStore,
        resource: Resource,
        passes: Filter,
        params: WatchParams,
        bookmark_every: float,
    ) -> None:
        self.store, self.resource, self.passes, self.params = store, resource, passes, params
        self.bookmark_every = bookmark_every
        self.response: web.StreamResponse | None = None
        self.transport: asyncio.Transport | None = None
        self.dropped = False

    def drop(self) -> None:
        """Abort the connection mid-stream, as a crashed apiserver or a broken network would."""
        self.dropped = True
        if self.transport is not None:
            self.transport.abort()

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """Subscribe and snapshot in one step, then stream; a compacted ``since`` is an ERROR 410 event."""
        initial: list[tuple[str, Obj]] = []
        try:
            sub, replay = self.store.subscribe(self.resource, self.params.since)
        except ApiError as exc:
            resp = await self._start(request)
            await self._send(resp, "ERROR", exc.status())
            await resp.write_eof()
            return resp
        try:
            if self.params.since is None:
                objs = self.store.objects(self.resource)
                initial = [("ADDED", o) for o in objs if self.passes(o)]
            else:
                initial = [ev for e in replay if (ev := convert(e, self.passes)) is not None]
            rv_at_start = self.store.rv
            resp = await self._start(request)
            for kind, obj in initial:
                await self._send(resp, kind, obj)
            if self.params.initial_events_end and self.params.bookmarks:
                end = {"k8s.io/initial-events-end": "true"}
                await self._send(resp, "BOOKMARK", bookmark(self.resource, rv_at_start, end))
            await self._pump(resp, sub)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away or the connection was dropped: nothing more to send
        finally:
            self.store.unsubscribe(sub)
        return self.response or web.StreamResponse()

    async def _pump(self, resp: web.StreamResponse, sub: Subscription) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if self.params.timeout is None else loop.time() + self.params.timeout
        next_bookmark = loop.time() + self.bookmark_every
        while True:
            wake = min(
                d
                for d in (deadline, next_bookmark if self.params.bookmarks else None, float("inf"))
                if d is not None
            )
            item: Event | End | None = None
            try:
                async with asyncio.timeout_at(None if wake == float("inf") else wake):
                    item = await sub.queue.get()
            except TimeoutError:
                pass
            items = [] if item is None else [item]
            while not sub.queue.empty():
                items.append(sub.queue.get_nowait())
            rv_now = self.store.rv  # read before any await: every event up to it is in ``items``
            for it in items:
                if isinstance(it, End):
                    if it.status is not None:
                        await self._send(resp, "ERROR", it.status)
                    return
                if (ev := convert(it, self.passes)) is not None:
                    await self._send(resp, *ev)
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if self.params.bookmarks and now >= next_bookmark:
                await self._send(resp, "BOOKMARK", bookmark(self.resource, rv_now))
                next_bookmark = now + self.bookmark_every

    async def _start(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self.response, self.transport = resp, request.transport
        if self.dropped:
            self.drop()
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, kind: str, obj: Obj) -> None:
        await resp.write(orjson.dumps({"type": kind, "object": obj}) + b"\n")
