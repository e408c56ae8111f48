"""Waiting for a condition that the code under test makes true, bounded, without fixed sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(cond: Callable[[], bool], timeout: float = 10.0, *, what: str = "condition") -> None:
    """Check ``cond`` every few milliseconds; AssertionError naming ``what`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.01)


async def until_async(
    cond: Callable[[], Awaitable[bool]],
    timeout: float = 10.0,
    *,
    what: str = "condition",
    every: float = 0.02,
) -> float:
    """``until`` for a condition another process makes true (an HTTP probe, an admin API):
    awaited every ``every`` s; AssertionError naming ``what`` after ``timeout`` s.  Returns
    ``time.monotonic()`` when the condition was first seen to hold, for tests that time an
    event against their own records (a failover's drop against the requests after it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(every)
    return time.monotonic()
