"""The proxy's ext_proc connections spread over a pod's workers by count, not by a hash.

``SO_REUSEPORT`` hands each new connection to a worker chosen by a hash of its addresses: *c*
connections all land on one of *N* workers with probability *N*^(1-*c*) (50% for an Envoy with
two threads in front of two workers), and a proxy keeps its ext_proc connections for hours, so
a pod could route on one of its cores for as long.  Envoy balances its own listeners' connections
across its threads (``exact_balance``); this does the same across processes:

- **At accept.** Every worker still listens (no acceptor whose death would close the port), but
  a worker that accepts a connection while a sibling holds fewer hands it to the one holding the
  fewest: the descriptor crosses over a Unix datagram socket in the run directory
  (``SCM_RIGHTS``), before TLS or HTTP/2 has read a byte, and the sibling serves it as its own.
  What each worker holds is one slot of a small shared file (``Slots``), written only by its
  owner when the count changes, read by a worker placing a connection: nothing per request.
- **Later.** A worker restarted, or a burst of connections placed at once, can leave one
  worker two or more connections above a sibling with nothing new to place.  Every
  ``REBALANCE_EVERY`` the most loaded worker then retires one connection (``Connection.retire``:
  GOAWAY without refusing a stream, RFC 9113's graceful two-step), at most once per
  ``RETIRE_GAP``; the proxy opens its next streams on a new connection, placed as above.

Between workers holding as many connections, a new one goes to one routing markedly fewer streams
a second (each worker's rate, written with its heartbeat): connections carry unequal shares.

Probers' connections (a first stream to grpc.health.v1) and retiring ones do not count.  A
handover that fails (the sibling is gone, or its queue is full) keeps the connection here: the
hash's worker is never worse than before.  A worker whose loop has not written its heartbeat for
``STALE_NS`` (hung, or stopped without its slot closed) is handed nothing, whatever it serves.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import mmap
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import structlog

from epp.server.placement import Holder
from epp.workers.role import WorkerRole

log = structlog.get_logger(__name__)

SLOTS_FILE: Final = "connections"
CLOSED: Final = -1  # the slot of a worker that takes no connection (starting, draining, dead)
REBALANCE_EVERY: Final = 1.0
RETIRE_GAP: Final = 5.0  # a retired connection's replacement needs a moment to be placed and counted
BEAT_EVERY: Final = 1.0  # each worker's loop writes its heartbeat this often
STALE_NS: Final = 3_000_000_000  # a worker whose loop has not beaten for this long is hung: hand it nothing
QUIETER: Final = 0.8  # between workers holding as many connections, one this much quieter gets the next
_CELL = 8  # bytes: one int64
_SENDER = struct.Struct("<H")  # a handover's one message: who handed it


class Slots:
    """What each worker serves, in a file of the run directory every worker maps.

    Per worker: the proxy's connections it serves (``CLOSED``: hand it none); per pair, the
    connections worker *i* handed to *j* and those *j* received from *i*.  The difference is
    what is on its way: a worker placing a burst of connections counts the ones it just handed
    over as its sibling's before the sibling has read them (counting only what each serves, one
    accept loop handed a whole burst to the same sibling).  Every cell has one writer (its
    worker; the supervisor for a dead worker's count), so no lock: an aligned 8-byte store is
    read whole, and a stale read costs at most one connection placed where the rebalancing
    step moves it later.
    """

    def __init__(self, path: Path, count: int) -> None:
        self.count = n = count
        # the layout: counts [n], handed [n * n], received [n * n], heartbeats [n], stream rates [n]
        self._handed = n
        self._received = n + n * n
        self._beats = n + 2 * n * n
        self._rates = self._beats + n
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), _cells(count) * _CELL)
        self._cells = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, path: Path, count: int) -> Slots:
        """The supervisor's, before any worker starts: every worker ``CLOSED``, nothing handed."""
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(struct.pack(f"<{count}q", *[CLOSED] * count) + bytes((_cells(count) - count) * _CELL))
        tmp.replace(path)
        return cls(path, count)

    def read(self, now_ns: int | None = None) -> list[int]:
        """Per worker: what it serves and what is on its way to it, or ``CLOSED`` (also when its
        loop has not beaten for ``STALE_NS``: a hung worker is handed nothing)."""
        cells, n = self._cells.tolist(), self.count
        handed, received, beats = self._handed, self._received, self._beats
        oldest = (time.monotonic_ns() if now_ns is None else now_ns) - STALE_NS
        out = []
        for j in range(n):
            held = cells[j]
            if held <= CLOSED or cells[beats + j] < oldest:
                out.append(CLOSED)
                continue
            on_its_way = sum(cells[handed + i * n + j] - cells[received + j * n + i] for i in range(n))
            out.append(held + max(0, on_its_way))
        return out

    def beat(self, index: int, now_ns: int | None = None) -> None:
        """Worker ``index``'s loop is alive (``CLOCK_MONOTONIC`` is one clock for the whole host)."""
        self._cells[self._beats + index] = time.monotonic_ns() if now_ns is None else now_ns

    def write(self, index: int, value: int) -> None:
        """Worker ``index`` serves ``value`` connections (``CLOSED``: none may be handed to it)."""
        self._cells[index] = value

    def handed(self, sender: int, to: int) -> None:
        self._cells[self._handed + sender * self.count + to] += 1

    def received(self, receiver: int, sender: int) -> None:
        self._cells[self._received + receiver * self.count + sender] += 1

    def settle(self, receiver: int) -> None:
        """A (re)started worker, before it takes handovers: what was on its way to its previous
        life went with that life's socket."""
        n = self.count
        for i in range(n):
            self._cells[self._received + receiver * n + i] = self._cells[self._handed + i * n + receiver]

    def rates(self) -> list[int]:
        """Per worker, the ext_proc streams it opened a second over its last heartbeat's interval."""
        return self._cells[self._rates : self._rates + self.count].tolist()

    def rate(self, index: int, streams_per_second: int) -> None:
        self._cells[self._rates + index] = streams_per_second

    def close(self) -> None:
        self._cells.release()
        self._map.close()


def _cells(count: int) -> int:
    return count + 2 * count * count + 2 * count  # the layout in ``Slots.__init__``


def target(counts: Sequence[int], me: int, rates: Sequence[int] = ()) -> int:
    """The worker that should serve a connection worker ``me`` accepted: the one holding the fewest.

    Among those holding as few, the one routing the fewest streams a second (``rates``), when it
    routes less than ``QUIETER`` of the others' rate: connections carry unequal shares (an Envoy's
    threads are not evenly loaded either), so a new one goes where the load is lighter.  Otherwise
    ``me`` on a tie (a handover costs a little, and moves nothing on a tie).
    """
    best, low = me, counts[me]
    for j, held in enumerate(counts):
        if CLOSED < held < low:
            best, low = j, held
    if not rates:
        return best
    quietest = best
    for j, held in enumerate(counts):
        if held == low and rates[j] < QUIETER * rates[quietest]:
            quietest = j
    return quietest


def should_retire(counts: Sequence[int], me: int) -> bool:
    """Whether worker ``me`` should move one of its connections: it holds at least two more than a
    sibling that takes connections (one would only swap the excess), and it is the most loaded
    (the lowest index of them, so that two workers do not both give one up)."""
    open_ = [held for held in counts if held > CLOSED]
    mine = counts[me]
    if not open_ or mine < min(open_) + 2:
        return False
    return counts.index(max(open_)) == me


class ConnectionBalance:
    """``epp.server.placement.Placement`` for worker ``role.index`` of a pod (``--workers N``)."""

    def __init__(
        self,
        role: WorkerRole,
        *,
        opened: Callable[[], int] = lambda: 0,
        rebalance_every: float = REBALANCE_EVERY,
        retire_gap: float = RETIRE_GAP,
    ) -> None:
        """``opened``: the ext_proc streams this worker has opened (the servicer's count), read on
        each heartbeat for the stream rate that breaks ties between workers."""
        self._role = role
        self._opened = opened
        self._opened_at: tuple[float, int] | None = None
        self._every = rebalance_every
        self._retire_gap = retire_gap
        self._slots = Slots(role.run_dir / SLOTS_FILE, role.count)
        self._inbox: socket.socket | None = None
        self._outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._outbox.setblocking(False)
        self._holder: Holder | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_retire = float("-inf")
        self._last_step = float("-inf")
        self._open = False
        self._stopped = False
        self.handed = 0  # connections this worker accepted and a sibling serves
        self.received = 0  # connections a sibling accepted and this worker serves
        self.retired = 0
        self.handover_failed = 0
        self.holding = 0  # what ``held`` last said

    def start(self, holder: Holder) -> None:
        path = self._role.handoff_socket()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a previous life's
        self._slots.settle(self._role.index)  # before binding: nothing can be on its way yet
        self._slots.beat(self._role.index)
        inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        inbox.bind(str(path))
        inbox.setblocking(False)
        self._inbox, self._holder, self._open = inbox, holder, True
        loop = asyncio.get_running_loop()
        loop.add_reader(inbox.fileno(), self._receive)
        self._timer = loop.call_later(min(self._every, BEAT_EVERY), self._tick)

    def place(self, sock: socket.socket) -> bool:
        me = self._role.index
        to = target(self._slots.read(), me, self._slots.rates())
        if to == me:
            return False
        try:
            # not socket.send_fds: before 3.12 it drops the address
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [sock.fileno()]))]
            self._outbox.sendmsg([_SENDER.pack(me)], rights, 0, str(self._role.handoff_socket(to)))
        except OSError as e:  # gone (restarting) or its queue full: the hash's worker serves it
            self.handover_failed += 1
            log.debug("worker_handover_failed", to=to, error=str(e))
            return False
        self._slots.handed(me, to)
        self.handed += 1
        return True

    def held(self, connections: int) -> None:
        self.holding = connections
        if self._open:
            self._slots.write(self._role.index, connections)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._open:
            self._open = False
            self._slots.write(self._role.index, CLOSED)
        if self._timer is not None:
            self._timer.cancel()
        if self._inbox is not None:
            asyncio.get_running_loop().remove_reader(self._inbox.fileno())
            self._inbox.close()  # with what is queued: the proxy connects again, to a worker not draining
            with contextlib.suppress(FileNotFoundError):
                self._role.handoff_socket().unlink()
        self._outbox.close()
        self._slots.close()

    def _receive(self) -> None:
        inbox, holder = self._inbox, self._holder
        assert inbox is not None
        assert holder is not None
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(inbox, _SENDER.size, 8)
            except (BlockingIOError, InterruptedError):
                return
            for fd in fds:
                try:
                    sock = socket.socket(fileno=fd)
                except OSError:
                    os.close(fd)
                    continue
                self.received += 1
                holder.adopt(sock)  # counted as held first: the pod never sees it on nobody's way
            if len(msg) == _SENDER.size and (sender := _SENDER.unpack(msg)[0]) < self._role.count:
                self._slots.received(self._role.index, sender)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(min(self._every, BEAT_EVERY), self._tick)
        self._slots.beat(self._role.index)
        now = loop.time()
        self.measure(now)
        if now - self._last_step >= self._every:
            self._last_step = now
            self.rebalance(now)

    def measure(self, now: float) -> None:
        """This worker's stream rate since the last heartbeat, for its siblings' tie-breaks."""
        opened, last = self._opened(), self._opened_at
        if last is not None and now > last[0]:
            self._slots.rate(self._role.index, round((opened - last[1]) / (now - last[0])))
        self._opened_at = (now, opened)

    def rebalance(self, now: float) -> bool:
        """One step (every ``rebalance_every``): retire a connection if this worker holds two more
        than a sibling and retired none within ``retire_gap``.  True when it did."""
        if now - self._last_retire < self._retire_gap or self._holder is None:
            return False
        if not (should_retire(self._slots.read(), self._role.index) and self._holder.retire_one()):
            return False
        self._last_retire = now
        self.retired += 1
        log.info("worker_connection_retired", worker=self._role.index, held=self._slots.read())
        return True
