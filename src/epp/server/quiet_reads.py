"""Peers' sync connections read in the wakes the loop has anyway while it routes.

Why: a ~200-byte write that makes the receiver's socket readable also wakes the receiving
process (the kernel's wakeup; on a VM an interrupt to another vCPU).  Measured on the bench
machine (``python -m bench.tcp_wakes``): the write costs the sender 14.6 µs instead of 5.0, and
the receiver 28.0 µs of CPU for the wake and its read instead of 4.9 for a read in a wake it
had anyway, for every batch of every peer.  A replica that routes is awake ~1,000 times a
second anyway.

So while the loop is busy (``ride`` calls, the ext_proc edge's reads, in ``BUSY_WINDOWS``
consecutive windows of ``BUSY_WINDOW``: ext_proc reads every 3 ms or less) the Publish
connections go quiet: each socket's ``SO_RCVLOWAT`` is raised to ``QUIET_LOWAT``, and the kernel
neither wakes this loop nor reports the socket readable until that much waits (a flood, a resend
of a large view).  What waits is read — a non-blocking read returns it whatever the low-water
mark — in wakes the loop has for something else: after an ext_proc read (``ride``) and after
the hub's send (``read_now``), at most once per ``gap``.  When no read ran for ``budget``, a
timer reads what waits, so a quiet batch is at most ``budget`` late; when no ride came for two budgets either
(the loop stopped routing), the connections first go back to waking the loop per message
(low-water mark 1), so an idle replica pays no timer.  End of file and errors wake the loop at
any low-water mark, and uvloop handles them as before.

Reads and the low-water mark go through a duplicate of the socket's descriptor, so a connection
uvloop has just closed (its number free for the next accept) is never touched by number; a
closing or write-paused connection is skipped.  What is read goes to the connection's
``data_received``: the same HTTP/2 parsing and limits as any read.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Final

from epp.server.h2.connection import Connection

QUIET_LOWAT: Final = 64 * 1024  # under every window we grant (16 MiB): a sender never stalls below it
READ_BYTES: Final = 256 * 1024
RIDE_GAP: Final = 0.001  # least time between two riding reads (each is a read per quiet connection)
BACKSTOP: Final = 0.004  # a quiet batch is read at most this late
# Rides in ``BUSY_WINDOWS`` consecutive windows of ``BUSY_WINDOW`` (each begun within 1.5 windows of
# the last) make the loop busy: ext_proc reads every 3 ms or less (a request's phases are several
# reads, so bench/scaleout's 200 req/s cells qualify and its 60 req/s cells do not).  A replica
# read less often is woken per message, as its peers' batches would mostly come between its reads.
BUSY_WINDOW: Final = 0.002
BUSY_WINDOWS: Final = 3


class QuietReads:
    """The Publish connections of one sync server and when to read them (module docstring)."""

    def __init__(self, gap: float = RIDE_GAP, budget: float = BACKSTOP) -> None:
        self.gap = gap  # least time between two riding reads
        self.budget = budget  # no read within it: the backstop reads (and without rides, wakes again)
        self.quiet = False  # the connections' low-water mark is raised (the loop is busy)
        self._socks: dict[Connection, socket.socket] = {}  # a duplicate of each connection's socket
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_ride = -1e9  # loop time of the last ride (any)
        self._window = -1e9  # loop time the current window of rides began
        self._streak = 0  # consecutive windows with a ride
        self._last = -1e9  # loop time of the last quiet read
        self._timer: asyncio.TimerHandle | None = None
        self._prompt = False
        self.cause = ""  # what runs the read in progress (the transport counts its messages by it)
        self.reads: dict[str, int] = {"riding": 0, "routing": 0, "timer": 0}  # reads that found bytes
        self.timer_wakes = 0
        self.switches = 0  # times the connections went quiet

    def add(self, conn: Connection) -> bool:
        """Track ``conn`` (a Publish call opened on it); False when its socket cannot be read here."""
        if conn in self._socks:
            return True
        transport = conn.transport
        if transport is None or transport.is_closing():
            return False
        try:
            # the default timeout (None) leaves the shared file's O_NONBLOCK, uvloop's, as it is
            sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        except (AttributeError, OSError):
            return False
        if self.quiet and not _low_water(sock, QUIET_LOWAT):
            sock.close()
            return False
        self._socks[conn] = sock
        self._loop = conn.loop
        return True

    def remove(self, conn: Connection) -> None:
        sock = self._socks.pop(conn, None)
        if sock is not None:
            sock.close()
        if not self._socks:
            self._wake_per_message()

    def close(self) -> None:
        for conn in list(self._socks):
            self.remove(conn)

    def prompt(self) -> None:
        """What was just read was late: the next riding read does not wait for ``gap``."""
        self._prompt = True

    def ride(self, cause: str) -> None:
        """The loop is awake for something else: read what waits, unless a read ran less than
        ``gap`` ago; while not quiet, count the ride towards ``BUSY_WINDOWS``."""
        loop = self._loop
        if loop is None or not self._socks:
            return
        now = loop.time()
        self._last_ride = now
        if not self.quiet:
            if now - self._window >= BUSY_WINDOW:  # a new window
                self._streak = self._streak + 1 if now - self._window < 1.5 * BUSY_WINDOW else 1
                self._window = now
                if self._streak >= BUSY_WINDOWS:
                    self._go_quiet(now)
            return
        if now - self._last >= self.gap or self._prompt:
            self._read(now, cause)

    def _go_quiet(self, now: float) -> None:
        self.quiet = True
        self.switches += 1
        for sock in self._socks.values():
            _low_water(sock, QUIET_LOWAT)
        self._last = now
        self._arm()

    def _wake_per_message(self) -> None:
        """Back to a wake per message: the loop went idle (or has no quiet connection left)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.quiet:
            self.quiet = False
            for sock in self._socks.values():
                _low_water(sock, 1)

    def _read(self, now: float, cause: str) -> None:
        self._last = now
        self._prompt = False
        found = False
        self.cause = cause
        try:
            for conn, sock in list(self._socks.items()):
                transport = conn.transport
                if transport is None or transport.is_closing() or conn.write_paused:
                    continue
                while True:
                    try:
                        data = os.read(sock.fileno(), READ_BYTES)
                    except OSError:  # nothing waits (EAGAIN), or an error uvloop reports on its own read
                        break
                    if not data:  # end of file: readable at any low-water mark, so uvloop sees it too
                        break
                    found = True
                    conn.data_received(data)
                    if len(data) < READ_BYTES or conn.transport is None:
                        break
        finally:
            self.cause = ""
        if found:
            self.reads[cause] += 1
        if self.quiet:
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(self.budget, self._on_timer) if self._loop is not None else None

    def _on_timer(self) -> None:
        """No read for ``budget``: read what waits.  Without a ride for two budgets the loop has
        stopped routing: wake per message again first (a message arriving between the two wakes
        the loop, so nothing is stranded)."""
        self._timer = None
        self.timer_wakes += 1
        if self._loop is None:
            return
        now = self._loop.time()
        if now - self._last_ride >= 2 * self.budget:
            self._wake_per_message()
            self._streak = 0
        self._read(now, "timer")


def _low_water(sock: socket.socket, value: int) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, value)
    except OSError:
        return False
    return True
