"""``until`` / ``until_async``: bounded waits that name what they waited for."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.testing.waiting import until, until_async


async def test_until_async_returns_once_another_task_makes_it_true() -> None:
    flag = asyncio.Event()
    probes = 0

    async def probe() -> bool:
        nonlocal probes
        probes += 1
        if probes == 3:
            flag.set()
        return flag.is_set()

    before = time.monotonic()
    seen = await until_async(probe, 5, every=0)
    assert probes == 3
    assert before <= seen <= time.monotonic()  # when it was first seen to hold, on the monotonic clock


async def test_until_async_names_what_it_waited_for() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"the peer.s backlog not met within 0\.05 s"):
        await until_async(never, 0.05, what="the peer's backlog", every=0.01)


async def test_until_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"ready not met within 0\.05 s"):
        await until(lambda: False, 0.05, what="ready")
