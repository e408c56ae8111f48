"""Cross-replica sync: staleness and CPU cost between two EPP sync hubs in two processes.

Run ``python -m bench.sync_lag [--quick]``; prints a table and writes bench/results/sync_lag.json.

Two processes on loopback, each a ``SyncHub`` over the real ZMQ transport sharing one
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
receiver's CPU over the run is what N-1 such streams cost each peer.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
from typing import Any

from bench.common import log, rnd, write_result
from epp.plugin.base import NoParams
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer, StaticPeers
from epp.sync.transport import ZmqTransport
from epp.testing.replicated import RoutedCounter
from epp.testing.waiting import until
from epp_sim.demo.procs import free_port_pair

ENDPOINTS = 8


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


def _hub(name: str, port: int, dirty: bool) -> tuple[SyncHub, TimedCounter]:
    hub = SyncHub(name, ZmqTransport("127.0.0.1", port), warm_start_timeout=0.3)
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
    port: int, peer: int, rate: float, seconds: float, dirty: bool, sync: bool, ready: Any
) -> dict[str, float]:
    hub, counter = _hub("sender", port, dirty)
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


async def _receiver(port: int, peer: int, seconds: float, ready: Any, done: Any) -> dict[str, Any]:
    hub, counter = _hub("receiver", port, False)
    hub.transport.bind()
    await hub.start(StaticPeers([Peer("sender", "127.0.0.1", peer)]))
    await until(lambda: hub.connected >= 1, 30, what="the sender heard")
    ready.set()
    cpu = time.process_time()
    await until(done.is_set, seconds + 30, what="the sender done")
    cpu = time.process_time() - cpu
    await asyncio.sleep(0.2)  # the last batches in flight
    await hub.stop()
    return {"lags": counter.lags, "cpu_s": cpu, "dropped": hub.stats.dropped}


def _run_sender(*args: Any) -> None:
    q = args[-1]
    q.put(("sender", asyncio.run(_sender(*args[:-1]))))


def _run_receiver(*args: Any) -> None:
    q = args[-1]
    q.put(("receiver", asyncio.run(_receiver(*args[:-1]))))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def one(rate: float, seconds: float, dirty: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    ready, done = ctx.Event(), ctx.Event()
    ps, pr = free_port_pair(), free_port_pair()
    off = ctx.Process(target=_run_sender, args=(ps, pr, rate, seconds, dirty, False, ready, q))
    off.start()
    _, baseline = q.get(timeout=seconds + 30)
    off.join()
    rx = ctx.Process(target=_run_receiver, args=(pr, ps, seconds, ready, done, q))
    tx = ctx.Process(target=_run_sender, args=(ps, pr, rate, seconds, dirty, True, ready, q))
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
    return {
        "mode": "dirty" if dirty else "poll",
        "rate": rate,
        "decisions": sent["decisions"],
        "deltas_applied": len(lags),
        "lag_ms_p50": rnd(statistics.median(lags)) if lags else None,
        "lag_ms_p99": rnd(_pct(lags, 0.99)),
        "lag_ms_max": rnd(max(lags)) if lags else None,
        "sender_cpu_s_sync_off": rnd(baseline["cpu_s"]),
        "sender_cpu_s_sync_on": rnd(sent["cpu_s"]),
        "sync_cpu_us_per_decision": rnd(per * 1e6),
        "receiver_cpu_s": rnd(res["receiver"]["cpu_s"]),
        "dropped": res["receiver"]["dropped"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 8.0
    rows = []
    for rate in (1000.0, 4000.0):
        for dirty in (False, True):
            log(f"rate {rate:.0f}/s, mode {'dirty' if dirty else 'poll'}, {seconds:g} s")
            rows.append(one(rate, seconds, dirty))
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
