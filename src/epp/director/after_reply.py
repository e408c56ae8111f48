"""Work that does not shape a reply runs after the reply is written: off the request's critical path.

Envoy waits for the EPP's reply to every ext_proc message it sends.  Much of what the EPP does
per message does not change that reply: counting a routed request on its endpoint, recording
its prefix, the response's health signals, usage and metrics, completion hooks that release
counters.  At a low rate every one of these runs cold, so it is tens of microseconds a request
that Envoy, and the client behind it, waited for.  Measured through Envoy at 200 req/s (syscall
traces of the EPP, docs/decisions.md, thirteenth pass): the response messages waited 26-44 µs
longer than the no-op floor's with this work inline, and none longer with it after the write.

``AfterReply`` is that queue.  The transport that serves ext_proc enables it (the EPP's own
HTTP/2 server) and, after each read, writes the replies the read produced and then runs what
was queued (``reading``/``finished_reading``).  Work queued outside a read (a routing task that
waited, a call owned by a task) runs on the loop's next iteration.  It runs in the order it was
queued; whoever is about to do work that must see it first calls ``run`` (routing a request:
in-flight counts and prefix insertions of the previous one count; a response step done inline:
the steps deferred before it).  Disabled (the default: the grpc.aio transport, tests driving a
director directly), ``defer`` runs the work at once.  A failure is logged and the rest runs: the
reply it could have changed is already gone, so only plugins that declare they never change it
(``AFTER_REPLY``, director.api) are ever deferred.

When the replies just written end a response (``hand_over``) and the EPP's connection had been
idle before the read (``finished_reading(idle=True)``: a request at a time, not a busy loop), the
queue gives up the CPU once (``sched_yield``) before it runs.  Envoy, woken by that reply,
forwards the response to the client, and the scheduler often wakes it on the CPU the EPP runs on
(wake-affine placement), where it waits until the EPP sleeps: on a 2-core machine shared with
Envoy, its wake after the EPP's last reply took 46-61 µs against 10 µs after the no-op floor's,
7-8 µs with the yield (docs/decisions.md, seventeenth pass).  Not after a routing reply: next in
line there is the model server, which comes back to the EPP, so yielding only moved the wait.
Not when busy: Envoy is then always runnable and every yield would switch.  With nothing else
runnable on the CPU (an EPP with cores of its own) the call returns at once.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Iterable
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Deferred(Protocol):
    """What the queue holds: an object that does its own waiting steps (``RequestLifecycle``)."""

    def run_later(self) -> None: ...


def after_reply_only(plugins: Iterable[object]) -> bool:
    """Whether every one of ``plugins`` declares ``AFTER_REPLY`` (true of none: nothing to wait for)."""
    return all(getattr(p, "AFTER_REPLY", False) for p in plugins)


class AfterReply:
    """A FIFO of work to run once the current replies are written (see the module docstring)."""

    __slots__ = ("_armed", "enabled", "hand_over", "queue", "reading")

    def __init__(self, *, enabled: bool = False) -> None:
        self.enabled = enabled
        self.queue: deque[Deferred] = deque()
        self.reading = False  # inside a transport read: it runs the queue once it has written
        self._armed = False  # a loop callback will run the queue
        self.hand_over = False  # the replies being written end a response (see the module docstring)

    def defer(self, item: Deferred) -> None:
        """Run ``item.run_later()`` after the replies now being produced are written (at once when disabled).

        An item queues itself once however many steps it keeps (a request's lifecycle: its
        steps in order): the queue pays a call per item and read, not per step.
        """
        if not self.enabled:
            item.run_later()
            return
        self.queue.append(item)
        if not self.reading and not self._armed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): nothing would run it later
                self.run()
                return
            self._armed = True
            loop.call_soon(self._run_armed)

    def run(self) -> None:
        """Run everything queued, in order, including what it queues; failures are logged.

        One item at a time off the front: an item that itself runs the queue (a deferred
        completion that lets flow control route a held request) goes on from the next one,
        so the order holds however the calls nest.
        """
        self.hand_over = False  # the work runs now: whoever the replies woke had its chance
        queue = self.queue
        while queue:
            item = queue.popleft()
            try:
                item.run_later()
            except Exception:
                log.exception("after_reply_failed", work=type(item).__qualname__)

    def finished_reading(self, idle: bool = False) -> None:
        """The transport wrote what its read produced: run the queue, after a yield when the
        replies end a response and the connection had been ``idle`` before the read."""
        self.reading = False
        if self.queue:
            if idle and self.hand_over:
                os.sched_yield()
            self.run()

    def _run_armed(self) -> None:
        self._armed = False
        if self.queue:
            self.run()
