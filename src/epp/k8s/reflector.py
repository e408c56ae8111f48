"""List + watch one kind of object and keep a local copy, surviving what real API servers do.

This is client-go's reflector, reduced to what the EPP needs:

* **list, then watch from the list's resourceVersion** with bookmarks, so no event is
  missed between the two and a quiet watch still advances its resourceVersion;
* a watch that ends (server timeout, dropped connection) **resumes from the last
  resourceVersion** without a relist;
* ``410 Gone`` (history compacted) **relists and reconciles by diff**: objects whose
  resourceVersion did not change produce no event, so endpoints that did not change do
  not flap; objects missing from the new list are reported deleted;
* any other failure (500s, an outage, refused connections) **backs off exponentially
  with jitter** while the handler keeps what it last saw, so routing goes on.

The handler hears ``upsert(obj)`` / ``delete(obj)`` in the order the server produced them and
``synced()`` after each (re)list has been applied.  Objects are plain dicts decoded with orjson:
the EPP reads a handful of fields and model classes would cost more than they give.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import aiohttp
import orjson
import structlog

from epp.k8s.errors import ApiError, raise_for_status

log = structlog.get_logger(__name__)

Obj = Mapping[str, Any]

MIN_WATCH_TIMEOUT: Final = 300.0  # client-go: server-side watch timeout in [5, 10) minutes
MAX_LINE: Final = 16 * 1024 * 1024  # one watch event; a Pod is a few KiB


class Handler(Protocol):
    def upsert(self, obj: Obj) -> None: ...

    def delete(self, obj: Obj) -> None: ...

    def synced(self) -> None: ...


class ListWatch(Protocol):
    """How to list and watch one resource (bound to its namespace and selectors)."""

    async def list(self) -> aiohttp.ClientResponse: ...

    async def watch(self, resource_version: str, timeout_seconds: int) -> aiohttp.ClientResponse: ...


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter: 0.5 s, 1 s, 2 s ... capped at 30 s."""

    initial: float = 0.5
    cap: float = 30.0
    attempt: int = 0
    rng: random.Random | None = None

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * 2.0 ** min(self.attempt, 30))
        self.attempt += 1
        r: float = (self.rng or random).random()
        return ceiling / 2 + r * ceiling / 2

    def reset(self) -> None:
        self.attempt = 0


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class Reflector:
    """Keeps ``store`` equal to the server's set of objects; ``run()`` loops until cancelled."""

    def __init__(
        self,
        what: str,
        source: ListWatch,
        handler: Handler,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.what = what
        self._source = source
        self.handler = handler
        self._backoff = backoff or Backoff()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.store: dict[str, Obj] = {}
        self.resource_version = ""
        self.has_synced = asyncio.Event()
        # counters for tests and the debug dump
        self.lists = 0
        self.watches = 0
        self.errors = 0
        self.last_error = ""

    async def run(self) -> None:
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("k8s_watch_expired", what=self.what, resource_version=self.resource_version)
                self.resource_version = ""  # relist at once: 410 is routine, not an outage
            except (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                self.errors += 1
                self.last_error = str(e) or type(e).__name__
                delay = self._backoff.next()
                log.warning(
                    "k8s_watch_error",
                    what=self.what,
                    error=self.last_error,
                    retry_in=round(delay, 2),
                    kept=len(self.store),
                )
                await self._sleep(delay)

    # list ---------------------------------------------------------------------------
    async def _list(self) -> None:
        resp = await self._source.list()
        async with resp:
            await raise_for_status(resp)
            body = orjson.loads(await resp.read())
        items = body.get("items") or []
        rv = str((body.get("metadata") or {}).get("resourceVersion", ""))
        self.lists += 1
        self._replace(items)
        self.resource_version = rv
        self._backoff.reset()
        self.handler.synced()
        self.has_synced.set()

    def _replace(self, items: list[Obj]) -> None:
        """Reconcile the store with a fresh list: only real changes reach the handler."""
        fresh = {object_key(o): o for o in items}
        for key in [k for k in self.store if k not in fresh]:
            self.handler.delete(self.store.pop(key))
        for key, obj in fresh.items():
            old = self.store.get(key)
            if old is not None and resource_version(old) == resource_version(obj):
                continue
            self.store[key] = obj
            self.handler.upsert(obj)

    # watch --------------------------------------------------------------------------
    async def _watch(self) -> None:
        timeout = int(MIN_WATCH_TIMEOUT * (1 + self._rng.random()))
        resp = await self._source.watch(self.resource_version, timeout)
        self.watches += 1
        async with resp:
            if resp.status == 410:
                raise Gone
            await raise_for_status(resp)
            async for event in _events(resp):
                self._apply(event)
                self._backoff.reset()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone
            raise ApiError(int(code or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        key = object_key(obj)
        if kind in ("ADDED", "MODIFIED"):
            self.store[key] = obj
            self.handler.upsert(obj)
        elif kind == "DELETED":
            old = self.store.pop(key, None)
            self.handler.delete(old if old is not None else obj)
        if rv:
            self.resource_version = rv


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[Mapping[str, Any]]:
    """Newline-delimited JSON events until the server ends the stream."""
    buf = b""
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            return
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ValueError(f"watch event longer than {MAX_LINE} bytes")
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield orjson.loads(line)


async def run_until_cancelled(reflector: Reflector) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await reflector.run()
