"""The servicer's bookkeeping of its sessions: what the drain on shutdown waits for."""

from __future__ import annotations

import asyncio

from epp.server.extproc import ExtProcServicer
from tests.server.harness import Harness


async def test_wait_idle_returns_once_the_last_session_closes() -> None:
    """Idle: at once.  Busy: when the last open session closes, for every waiter, and again for
    a later drain (the event is made only while someone waits)."""
    servicer = ExtProcServicer(Harness().director)
    await asyncio.wait_for(servicer.wait_idle(), 1)
    for _ in range(2):
        first, second = servicer.open(), servicer.open()
        waiters = [asyncio.ensure_future(servicer.wait_idle()) for _ in range(2)]
        await asyncio.sleep(0)
        first.close()
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters) and servicer.active_sessions == 1
        second.close()
        await asyncio.wait_for(asyncio.gather(*waiters), 1)
        assert servicer.active_sessions == 0 and servicer.opened in (2, 4)
    await asyncio.wait_for(servicer.wait_idle(), 1)
