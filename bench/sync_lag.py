"""Cross-replica sync: staleness and CPU cost between two EPP sync hubs in two processes.

Run ``python -m bench.sync_lag [--quick]``; prints a table and writes bench/results/sync_lag.json.

Two processes on loopback, each a ``SyncHub`` over a real transport (ZMQ, or the EPP's own
HTTP/2, the default since the fifteenth pass: the ``transport`` column) sharing one
plugin that counts routing decisions per endpoint (as in-flight load does).  The sender
makes decisions at a steady rate (open loop, in 1 ms slices); each delta carries the wall
time of the first decision it reports, and the receiver records, per delta, the time from
that decision to its ``apply`` — the issue's staleness: "from a routing decision on one
replica to its peers counting it", goal p99 ≤ 10 ms on loopback.  Two drain modes:

* ``poll``: the plugin only records changes; the hub drains every 5 ms (``DEFAULT_POLL``);
* ``dirty``: the plugin calls ``sync_dirty()`` on a change (every shipped plugin does); the
  hub sends at most ``hold`` after the first change, or with the next wake's change, and at
  most once per ``gap`` (``SyncHub.dirty``); a busy receiver reads at most once per
  ``read_gap`` (``ZmqTransport.listen``).

Cost: the sender's CPU (``time.process_time``, all threads: libzmq's I/O thread included)
over the run, against the same decision loop with sync off, in the same run; the
difference per decision is what sync adds to each request on the sending replica.  The
receiver's CPU over the run is what N-1 such streams cost each peer; per batch it received,
with the wakes of its loop's thread (voluntary context switches) per batch.

A receiver that routes: with ``routing`` > 0 the receiver's loop also wakes that many times a
second for work of its own (as ext_proc reads wake a routing replica), an empty callback on a
timer, and with ``ride`` each such wake calls ``ZmqTransport.ride`` (as the h2 server does for
every read), so peers' batches are read in those wakes instead of wakes of their own.  The
receiver rows with ``routing`` compare ride off and on at the same wakes; ``routing`` 0 is an
idle receiver (what every row measured before).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import log, rnd, write_result
from epp.plugin.base import NoParams
from epp.server.peering import transport_for
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer, StaticPeers
from epp.testing.replicated import RoutedCounter
from epp.testing.waiting import until
from epp_sim.demo.procs import free_port_pair

ENDPOINTS = 8
# A routing receiver's own wakes a second: a replica at 250 req/s, two ext_proc reads a request.
ROUTING = 500.0


class TimedCounter(RoutedCounter):
    """Deltas carry the wall time of the first decision they report; ``apply`` records the lag."""

    def __init__(self, dirty: bool) -> None:
        super().__init__("bench", NoParams(), None)
        self.use_dirty = dirty
        if not dirty:
            del self.sync_dirty  # the hub then drains on its DEFAULT_POLL cadence
        self.first: dict[str, float] = {}
        self.lags: list[float] = []

    def count(self, endpoint: str, n: int = 1) -> None:
        self.own[endpoint] = self.own.get(endpoint, 0) + n
        if endpoint not in self.first:
            self.first[endpoint] = time.time()
        if self.use_dirty and self.sync_dirty is not None:
            self.sync_dirty()  # only read in dirty mode (the attribute is gone in poll mode)

    def drain(self) -> list[Any]:
        out = [[e, self.own[e], t] for e, t in self.first.items()]
        self.first.clear()
        return out

    def apply(self, origin: str, deltas: list[Any]) -> None:
        now = time.time()
        for _endpoint, _count, t in deltas:
            self.lags.append(now - t)


def _hub(name: str, port: int, dirty: bool, transport: str) -> tuple[SyncHub, TimedCounter]:
    hub = SyncHub(name, transport_for(transport, "127.0.0.1", port), warm_start_timeout=0.3)
    counter = TimedCounter(dirty)  # poll mode: count() leaves the hub's sync_dirty uncalled
    hub.bind([counter])
    return hub, counter


async def _decide(counter: TimedCounter, rate: float, seconds: float) -> int:
    loop = asyncio.get_running_loop()
    start = loop.time()
    made = 0
    while (elapsed := loop.time() - start) < seconds:
        due = int(elapsed * rate)
        while made < due:
            counter.count(f"e{made % ENDPOINTS}")
            made += 1
        await asyncio.sleep(0.001)  # pacing: 1 ms slices of open-loop decisions
    return made


async def _sender(
    port: int, peer: int, rate: float, seconds: float, dirty: bool, sync: bool, transport: str, ready: Any
) -> dict[str, float]:
    hub, counter = _hub("sender", port, dirty, transport)
    if sync:
        hub.transport.bind()
        await hub.start(StaticPeers([Peer("receiver", "127.0.0.1", peer)]))
        await until(ready.is_set, 30, what="the receiver hearing us (its SUB is connected)")
    cpu = time.process_time()
    made = await _decide(counter, rate, seconds)
    cpu = time.process_time() - cpu
    if sync:
        await hub.stop()
    return {"decisions": made, "cpu_s": cpu}


def _loop_wakes() -> int:
    """Voluntary context switches of this process's main thread (the event loop's)."""
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/status") as f:
        return int(f.read().split("\nvoluntary_ctxt_switches:")[1].split()[0])


async def _routing(rate: float, ride: Callable[[], None] | None) -> None:
    """Wake the loop ``rate`` times a second, as a routing replica's ext_proc reads do."""
    loop = asyncio.get_running_loop()
    start, k = loop.time(), 0
    while True:
        k += 1
        await asyncio.sleep(max(0.0, start + k / rate - loop.time()))
        if ride is not None:
            ride()


async def _receiver(
    port: int, peer: int, seconds: float, routing: float, ride: bool, transport: str, ready: Any, done: Any
) -> dict[str, Any]:
    hub, counter = _hub("receiver", port, False, transport)
    hub.transport.bind()
    await hub.start(StaticPeers([Peer("sender", "127.0.0.1", peer)]))
    await until(lambda: hub.connected >= 1, 30, what="the sender heard")
    router = asyncio.create_task(_routing(routing, hub.transport.ride if ride else None)) if routing else None
    ready.set()
    cpu, loop_cpu, wakes, received = (
        time.process_time(),
        time.thread_time(),
        _loop_wakes(),
        hub.stats.received,
    )
    await until(done.is_set, seconds + 30, what="the sender done")
    cpu, loop_cpu, wakes = time.process_time() - cpu, time.thread_time() - loop_cpu, _loop_wakes() - wakes
    received = hub.stats.received - received
    if router is not None:
        router.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await router
    await asyncio.sleep(0.2)  # the last batches in flight
    reads = hub.debug_state()["reads"]
    await hub.stop()
    return {
        "lags": counter.lags,
        "cpu_s": cpu,
        "loop_cpu_s": loop_cpu,
        "wakes": wakes,
        "received": received,
        "dropped": hub.stats.dropped,
        "reads": reads,
    }


def _run_sender(*args: Any) -> None:
    q = args[-1]
    q.put(("sender", asyncio.run(_sender(*args[:-1]))))


def _run_receiver(*args: Any) -> None:
    q = args[-1]
    q.put(("receiver", asyncio.run(_receiver(*args[:-1]))))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def one(
    rate: float, seconds: float, dirty: bool, routing: float = 0.0, ride: bool = False, transport: str = "zmq"
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    ready, done = ctx.Event(), ctx.Event()
    ps, pr = free_port_pair(), free_port_pair()
    off = ctx.Process(target=_run_sender, args=(ps, pr, rate, seconds, dirty, False, transport, ready, q))
    off.start()
    _, baseline = q.get(timeout=seconds + 30)
    off.join()
    rx = ctx.Process(target=_run_receiver, args=(pr, ps, seconds, routing, ride, transport, ready, done, q))
    tx = ctx.Process(target=_run_sender, args=(ps, pr, rate, seconds, dirty, True, transport, ready, q))
    rx.start()
    tx.start()
    first = q.get(timeout=seconds + 30)
    done.set()
    second = q.get(timeout=30)
    tx.join()
    rx.join()
    res = dict([first, second])
    lags = [x * 1000 for x in res["receiver"]["lags"]]
    sent = res["sender"]
    per = (sent["cpu_s"] - baseline["cpu_s"]) / max(1, sent["decisions"])
    rcv = res["receiver"]
    batches = max(1, rcv["received"])
    return {
        "transport": transport,
        "mode": "dirty" if dirty else "poll",
        "rate": rate,
        "routing": routing,
        "ride": ride,
        "decisions": sent["decisions"],
        "deltas_applied": len(lags),
        "lag_ms_p50": rnd(statistics.median(lags)) if lags else None,
        "lag_ms_p99": rnd(_pct(lags, 0.99)),
        "lag_ms_max": rnd(max(lags)) if lags else None,
        "sender_cpu_s_sync_off": rnd(baseline["cpu_s"]),
        "sender_cpu_s_sync_on": rnd(sent["cpu_s"]),
        "sync_cpu_us_per_decision": rnd(per * 1e6),
        "receiver_cpu_s": rnd(rcv["cpu_s"]),
        "receiver_batches": rcv["received"],
        "receiver_cpu_us_per_batch": rnd(rcv["cpu_s"] / batches * 1e6, 1),
        # of which the event loop's thread (the rest: libzmq's I/O thread, the hub's tick)
        "receiver_loop_cpu_us_per_batch": rnd(rcv["loop_cpu_s"] / batches * 1e6, 1),
        "receiver_wakes_per_batch": rnd(rcv["wakes"] / batches, 2),
        # reads by cause over the whole run: the descriptor, the busy timer, requests' wakes
        "receiver_reads": {k: rcv["reads"][k] for k in ("woken", "timer", "routing", "timerWakes")},
        "dropped": rcv["dropped"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of the routing receiver's ride off / on"
    )
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 8.0
    rows = []
    for rate in (1000.0, 4000.0):
        for dirty, transport in ((False, "zmq"), (True, "zmq"), (True, "h2")):
            log(f"rate {rate:.0f}/s, mode {'dirty' if dirty else 'poll'}, {transport}, {seconds:g} s")
            rows.append(one(rate, seconds, dirty, transport=transport))
    # a routing receiver (its loop woken ROUTING times a second for work of its own): ZMQ with ride
    # off / on, and HTTP/2 (read as messages arrive: nothing rides), alternating, so the three are
    # compared in the same minutes
    for _ in range(args.rounds):
        for ride, transport in ((False, "zmq"), (True, "zmq"), (False, "h2")):
            log(
                f"rate 1000/s, dirty, receiver routing {ROUTING:g} wakes/s, {transport}, "
                f"ride {ride}, {seconds:g} s"
            )
            rows.append(one(1000.0, seconds, True, ROUTING, ride, transport))
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    path = write_result(
        "sync_lag", {"seconds": seconds, "rows": rows}, mode="quick" if args.quick else "full", seeds={}
    )
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
