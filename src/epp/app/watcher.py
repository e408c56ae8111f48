"""Notice that the config file changed: poll its content, debounce, and re-read at once on SIGHUP.

Why content and not mtime: a Kubernetes ConfigMap volume updates by swapping the ``..data``
symlink (the file's own mtime and inode, seen through the link, may not change the way a
stat watch expects), editors write a new file and rename it over the old one, and a
``cp`` may be caught half-written.  So every ``interval`` the resolved path is read whole
(off the event loop) and hashed; a new hash is handed over only once it has been seen on
two polls in a row (a write still in progress has usually moved on by then, and one that
stopped half-way is handed over, rejected by validation, and followed by the whole file).
A file that cannot be read (the moment between unlink and rename) counts as no change.

A poll reads only when a ``stat`` of the path (on the loop: ~2 µs) says the file may have
changed (``epp.datalayer.watch.FileStamp``, the rule every watched file follows: another file
behind the path, another size, mtime or ctime, or a change time within ``RECENT`` of now), or a
digest waits for its second sighting.  Reading in a thread every poll cost the serving loop
more than the read: a thread that wants the GIL while the busy loop holds it is woken at each
of the loop's releases, ~1,600 times a second at capacity for these four reads a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import structlog

from epp.datalayer.watch import FileStamp

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL: Final = 0.25

OnChange = Callable[[bytes, str, str], Awaitable[object]]  # (content, digest, trigger)


def digest(data: bytes) -> str:
    """The content hash the metrics and logs name a config version by (16 hex digits)."""
    return hashlib.sha256(data).hexdigest()[:16]


class ConfigWatcher:
    """Calls ``on_change(content, digest, trigger)`` when ``path``'s content changed.

    ``trigger`` is ``"file"`` for a change seen by polling and ``"sighup"`` for ``hup()``,
    which re-reads now and hands the content over even when it did not change (the
    receiver decides whether it is new).  ``interval <= 0`` disables polling; ``hup``
    still works.  ``on_change`` runs on the watcher's task, one call at a time.
    """

    def __init__(self, path: str, on_change: OnChange, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.path = path
        self._on_change = on_change
        self._interval = interval
        self._seen: str | None = None  # the digest last handed over (or set by ``seen``)
        self._pending: str | None = None  # a new digest seen once, waiting to be seen again
        self._hup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unreadable = False
        self._stamp = FileStamp(path)

    def seen(self, value: str) -> None:
        """The digest of the content already in use (no change to report for it)."""
        self._seen = value

    def hup(self) -> None:
        """Re-read now (a signal handler; safe to call from the event loop's thread only)."""
        self._hup.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"config-watch:{self.path}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        timeout = self._interval if self._interval > 0 else None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hup.wait(), timeout)
            forced = self._hup.is_set()
            self._hup.clear()
            try:
                await self.check(force=forced)
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher must outlive any one bad version
                log.exception("config_watch_failed", file=self.path)

    def _read(self) -> bytes | None:
        try:
            data = Path(self.path).read_bytes()
        except OSError as e:
            if not self._unreadable:
                log.warning("config_file_unreadable", file=self.path, error=e.strerror or str(e))
            self._unreadable = True
            return None
        self._unreadable = False
        return data

    def _may_have_changed(self) -> bool:
        return self._stamp.changed() is not False  # None (no stat): the read says why, logged once

    async def check(self, *, force: bool = False) -> bool:
        """One poll; returns True when ``on_change`` was called."""
        if not force and self._pending is None and not self._may_have_changed():
            return False
        data = await asyncio.to_thread(self._read)
        if data is None:
            return False
        current = digest(data)
        if force:
            self._pending = None
        elif current == self._seen:
            self._pending = None
            return False
        elif current != self._pending:
            self._pending = current  # debounce: hand it over when the next poll sees it too
            return False
        self._pending = None
        self._seen = current
        await self._on_change(data, current, "sighup" if force else "file")
        return True
