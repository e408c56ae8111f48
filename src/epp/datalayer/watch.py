"""Re-read a file when it changes; a bad edit keeps the last good content and says why.

Whether a file may have changed is one ``stat`` (``FileStamp``), shared with the config-file
watcher (app/watcher): another file behind the path (device, inode: a rename, a swapped
symlink), another size, mtime or ctime, or a change time within ``RECENT`` of now.  The last
rule closes two gaps of comparing (mtime, size, inode) alone: a write in the same coarse
timestamp tick as the stat before it leaves every field as it was, and ``cp -p`` onto the file
puts the old mtime back (ctime cannot be set back; a same-size copy changed nothing else).  A
file that may have changed is read; it is applied only when its content differs from what was
last applied (or last rejected), so a ``touch``, a ``chmod`` or a recent change re-reads
without re-applying.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import structlog

from epp.errors import ConfigError

log = structlog.get_logger(__name__)

T = TypeVar("T")

RECENT: Final = 2.0  # seconds: a file changed this recently may have changed since any stat of it


class FileStamp:
    """What one ``stat`` of ``path`` says about a change since the previous call (module docstring)."""

    __slots__ = ("_stat", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._stat: tuple[int, int, int, int, int] | None = None

    def changed(self) -> bool | None:
        """True when the file may have changed since the last call; None when it cannot be stat'ed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        stat = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if stat != self._stat:
            self._stat = stat
            return True
        return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RECENT * 1e9


class WatchedFile(Generic[T]):
    """Polls ``path`` (stat only: cheap, and robust to editors that replace files by rename).

    ``load(text) -> T`` validates the content and raises ``ConfigError`` naming the field;
    ``apply(value)`` installs it.  ``start()`` loads once and raises on a bad file, so a
    broken file fails startup; later failures are logged and the last good value stays.
    """

    def __init__(
        self,
        path: str,
        load: Callable[[str], T],
        apply: Callable[[T], None],
        *,
        interval: float = 1.0,
        what: str = "file",
    ) -> None:
        self.path = path
        self._load = load
        self._apply = apply
        self._interval = interval
        self._what = what
        self._stamp = FileStamp(path)
        self._text: str | None = None  # the content last applied, or last rejected
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0  # successful loads after the first (for tests and logs)
        self.failures = 0

    def _read_text(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"{self._what} {self.path}: cannot read: {e.strerror or e}") from None

    def _read_new(self) -> tuple[str, T] | None:
        """The content and its loaded value when it differs from the last seen; None when it does not.

        Runs in a thread (file I/O, and loading may resolve names); the content is noted as seen
        before loading, so a bad version is reported once, not at every poll.
        """
        text = self._read_text()
        if text == self._text:
            return None
        self._text = text
        return text, self._load(text)

    def load_now(self) -> None:
        """Read, validate and apply the file; raise ``ConfigError`` if it is bad (startup path)."""
        self._stamp.changed()  # the stat before the read: a write after it shows at the next poll
        text = self._read_text()
        self._apply(self._load(text))
        self._text = text

    async def start(self) -> None:
        self.load_now()
        self._task = asyncio.create_task(self._run(), name=f"watch:{self.path}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.check()

    async def check(self) -> bool:
        """Reload if the file changed; returns True when a new version was applied.

        A file that cannot be stat'ed (missing, mid-swap) is no change: the last version stays.
        """
        if not self._stamp.changed():
            return False
        try:
            new = await asyncio.to_thread(self._read_new)  # file I/O and DNS stay off the event loop
        except ConfigError as e:
            self.failures += 1
            log.error(  # noqa: TRY400 - the ConfigError names the field; a traceback adds nothing
                "file_reload_failed", file=self.path, what=self._what, error=str(e), kept="last good version"
            )
            return False
        if new is None:  # read again (a touch, a recent change): the same content
            return False
        self._apply(new[1])
        self.reloads += 1
        log.info("file_reloaded", file=self.path, what=self._what)
        return True
