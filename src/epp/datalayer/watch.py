"""Re-read a file when it changes; a bad edit keeps the last good content and says why."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

from epp.errors import ConfigError

log = structlog.get_logger(__name__)

T = TypeVar("T")


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


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
        self._sig: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0  # successful loads after the first (for tests and logs)
        self.failures = 0

    def _read(self) -> T:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"{self._what} {self.path}: cannot read: {e.strerror or e}") from None
        return self._load(text)

    def load_now(self) -> None:
        """Read, validate and apply the file; raise ``ConfigError`` if it is bad (startup path)."""
        sig = _signature(self.path)
        self._apply(self._read())
        self._sig = sig

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
        """Reload if the file changed; returns True when a new version was applied."""
        sig = _signature(self.path)
        if sig is None or sig == self._sig:
            return False
        try:
            value = await asyncio.to_thread(self._read)  # file I/O and DNS stay off the event loop
        except ConfigError as e:
            self._sig = sig  # do not re-log the same bad version every second
            self.failures += 1
            log.error(  # noqa: TRY400 - the ConfigError names the field; a traceback adds nothing
                "file_reload_failed", file=self.path, what=self._what, error=str(e), kept="last good version"
            )
            return False
        self._apply(value)
        self._sig = sig
        self.reloads += 1
        log.info("file_reloaded", file=self.path, what=self._what)
        return True
