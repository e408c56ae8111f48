"""Run a coroutine at once, in the caller's callback, and make a task of it only if it waits.

Python 3.12's eager tasks, for 3.11: routing a request is a coroutine (admission and data
producers may wait) but almost always finishes without waiting, and a task for it costs a
task object, a loop callback and a loop iteration before its replies are written (~10 µs
a request, as much as the scheduler).  ``start`` steps the coroutine once from the read
callback; if it finishes, the result comes back at once.  If it waits on a future, a task
takes over from exactly there.

While it runs synchronously a stand-in is the loop's current task (``asyncio.timeout`` and
friends need one); if the coroutine then waits, the stand-in forwards cancellation to the
real task, so a timeout armed during the eager step still cancels the right thing.  The
step runs in a copy of the caller's context, the one the task then keeps, as a task would.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# What asyncio's own eager start does in 3.12 (``_swap_current_task``); they take any object.
_enter_task: Callable[[asyncio.AbstractEventLoop, object], None] = asyncio.tasks._enter_task  # type: ignore[assignment]
_leave_task: Callable[[asyncio.AbstractEventLoop, object], None] = asyncio.tasks._leave_task  # type: ignore[assignment]


class _StandIn:
    """The current task while the coroutine runs eagerly; then the real task's proxy."""

    __slots__ = ("_cancelling", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self._cancelling = 0

    def cancel(self, msg: Any = None) -> bool:
        if self.task is not None:
            return self.task.cancel(msg)
        self._cancelling += 1  # not reachable in practice: nothing runs during the eager step
        return True

    def cancelling(self) -> int:
        return self.task.cancelling() if self.task is not None else self._cancelling

    def uncancel(self) -> int:
        if self.task is not None:
            return self.task.uncancel()
        self._cancelling = max(0, self._cancelling - 1)
        return self._cancelling


class Started(Generic[T]):
    """What ``start`` returns: ``done`` and its ``result()`` (or exception), or the ``task`` that goes on."""

    __slots__ = ("_error", "_result", "done", "task")

    def __init__(self) -> None:
        self.done = False
        self.task: asyncio.Task[T] | None = None
        self._result: T | None = None
        self._error: BaseException | None = None

    def result(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def start(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> Started[T]:
    """Step ``coro`` now; ``done`` if it finished, else a task continues it where it waits."""
    out: Started[T] = Started()
    stand_in = _StandIn()
    context = contextvars.copy_context()
    caller = asyncio.current_task(loop)  # None from a read callback; a test may call from a task
    if caller is not None:
        _leave_task(loop, caller)
    _enter_task(loop, stand_in)
    try:
        yielded = context.run(coro.send, None)
    except StopIteration as stop:
        out.done = True
        out._result = stop.value
        return out
    except BaseException as e:
        out.done = True
        out._error = e
        return out
    finally:
        _leave_task(loop, stand_in)
        if caller is not None:
            _enter_task(loop, caller)
    task = loop.create_task(_resume(coro, yielded), context=context)
    stand_in.task = task
    out.task = task
    return out


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Continue ``coro``, which yielded ``yielded`` to its (absent) task: the task now drives it."""
    while True:
        try:
            sent = yield yielded
        except BaseException as e:  # the task's cancellation, or an exception thrown in
            try:
                yielded = coro.throw(e)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value
