"""``epp.server.h2.eager.start``: a coroutine run at once, a task only when it waits, with task semantics kept."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from epp.server.h2.eager import start

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("eager_test", default="caller")


async def _sync_route() -> list[str]:
    async with asyncio.timeout(1.0):  # needs a current task even though nothing waits
        await _no_wait()
        return ["reply"]


async def _no_wait() -> None:
    return None


async def test_a_coroutine_that_does_not_wait_finishes_without_a_task() -> None:
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks(loop)
    started = start(_sync_route(), loop)
    assert started.done
    assert started.task is None
    assert started.result() == ["reply"]
    assert asyncio.all_tasks(loop) == before
    assert asyncio.current_task(loop) is not None  # the calling task is current again


async def test_an_exception_comes_back_from_result() -> None:
    async def boom() -> None:
        raise ValueError("bad")

    started = start(boom(), asyncio.get_running_loop())
    assert started.done
    with pytest.raises(ValueError, match="bad"):
        started.result()


async def test_a_coroutine_that_waits_goes_on_in_a_task_from_where_it_waited() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    steps: list[str] = []

    async def route() -> int:
        steps.append("eager")
        value = await gate
        steps.append("task")
        return value + 1

    started = start(route(), loop)
    assert not started.done
    assert started.task is not None
    assert steps == ["eager"]
    gate.set_result(41)
    assert await started.task == 42
    assert steps == ["eager", "task"]


async def test_a_timeout_armed_eagerly_cancels_the_task_that_took_over() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    outcome: list[str] = []

    async def route() -> str:
        try:
            async with asyncio.timeout(0.01):
                await never
        except TimeoutError:
            outcome.append("timed out")
        return "answered"

    started = start(route(), loop)
    assert started.task is not None
    assert await asyncio.wait_for(started.task, 5.0) == "answered"
    assert outcome == ["timed out"]
    assert started.task.cancelling() == 0  # the timeout took back its cancellation


async def test_cancelling_the_task_reaches_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    cleaned: list[bool] = []

    async def route() -> None:
        try:
            await never
        finally:
            cleaned.append(True)

    started = start(route(), loop)
    assert started.task is not None
    await asyncio.sleep(0)  # the task is waiting on ``never``
    started.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started.task
    assert cleaned == [True]


async def test_context_changes_stay_with_the_coroutine_as_in_a_task() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()

    async def route() -> str:
        VAR.set("route")
        await gate
        return VAR.get()

    started = start(route(), loop)
    assert VAR.get() == "caller"  # not leaked into the caller
    assert started.task is not None
    gate.set_result(None)
    assert await started.task == "route"


def test_from_a_loop_callback_no_task_is_current_afterwards() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[object] = []
        done = loop.create_future()

        def callback() -> None:
            started = start(_sync_route(), loop)
            seen.append(started.result())
            seen.append(asyncio.current_task(loop))
            done.set_result(None)

        loop.call_soon(callback)
        await done
        assert seen == [["reply"], None]

    asyncio.run(main())
