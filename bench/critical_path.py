"""How long Envoy waits for each ext_proc reply at a low rate: the critical path of a request through
each ext_proc server, traced from the server's own system calls.

    python -m bench.critical_path [--rate 200] [--seconds 4] [--rounds 3]

``bench.overhead``'s added p50 (the EPP's latency over the no-op floor at 200 req/s) is the sum,
over the messages of one exchange, of how much longer Envoy waits for the EPP's reply than for the
floor's; its 2 s windows are too noisy to resolve a change of a few tens of microseconds.  This
bench measures the waits themselves.  For each path (the no-op floor on the EPP's transport, the
EPP with the default and the prefix-heavy configs, all behind the same Envoy, as bench/overhead
builds them), while an open-loop Poisson load runs at ``--rate``, ``perf record`` traces the
server's ``raw_syscalls`` (enter and exit, every thread); then, on the loop's thread (the one with
the most system calls), each read that returned bytes is paired with the next ``write`` (the reply
going out; an ``epoll_wait`` in between means the read was answered by nothing).  A read of more
than 1,000 bytes is the request (its headers and body messages, answered by the routing reply), one
of 100-1,000 bytes the response (headers and body, answered by their replies); smaller reads are
control frames.  Per path and class: the median wait; per EPP path: its medians over the floor's,
per round, and their median over the rounds (paths alternate within a round).

At 200 req/s every message finds the server cold (caches and branch predictors taken by Envoy,
the client and the simulators in between), so these are the cold costs that a busy server does
not pay; bench.instructions and bench.live_cost count the warm ones.  Needs ``perf`` and the
right to trace the server (root, or ``kernel.perf_event_paranoid`` <= 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import signal
import statistics
import tempfile
from collections import Counter
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any, Final

from bench.common import added_over_floor, log, rnd, write_result
from bench.httpload import closed_loop, open_loop
from bench.overhead import SEED, chat_requests
from bench.paths import EPP, EPP_PREFIX, FLOOR_H2, Lab

READ: Final = 0  # x86-64 system call numbers
WRITE: Final = 1
WAITS: Final = frozenset({232, 281})  # epoll_wait, epoll_pwait: the loop went back to sleep
REQUEST_BYTES: Final = 1000  # a read above this carries a request's headers and body messages
RESPONSE_BYTES: Final = 100  # one above this (and up to REQUEST_BYTES) a response's messages
_EVENT: Final = re.compile(
    r"\s*\S+\s+(?P<tid>\d+)\s+\[\d+\]\s+(?P<t>[\d.]+):\s+raw_syscalls:sys_(?P<kind>enter|exit):"
    r"\s+NR (?P<nr>\d+) (?:\((?P<args>[^)]*)\)|= (?P<ret>-?\d+))"
)


def waits(lines: Iterable[str]) -> dict[str, list[float]]:
    """Microseconds from each read to the write that answered it, by class, on the busiest thread.

    ``lines`` is ``perf script``'s text of a ``raw_syscalls`` recording.
    """
    events = []
    for line in lines:
        m = _EVENT.match(line)
        if m is not None:
            events.append((int(m["tid"]), float(m["t"]), m["kind"], int(m["nr"]), m["ret"]))
    if not events:
        return {}
    loop_thread = Counter(e[0] for e in events).most_common(1)[0][0]
    out: dict[str, list[float]] = {"request": [], "response": [], "control": []}
    pending: tuple[float, int] | None = None  # (when, bytes) of the first read not yet answered
    for tid, t, kind, nr, ret in events:
        if tid != loop_thread:
            continue
        if kind == "exit" and nr == READ and ret is not None and int(ret) > 0:
            if pending is None:
                pending = (t, int(ret))
        elif kind == "enter" and nr == WRITE and pending is not None:
            size = pending[1]
            cls = "request" if size > REQUEST_BYTES else "response" if size > RESPONSE_BYTES else "control"
            out[cls].append((t - pending[0]) * 1e6)
            pending = None
        elif kind == "enter" and nr in WAITS:
            pending = None
    return out


def medians(w: dict[str, list[float]], least: int = 50) -> dict[str, float]:
    """Each class's median wait, for classes seen at least ``least`` times."""
    return {cls: round(statistics.median(v), 1) for cls, v in w.items() if len(v) >= least}


async def _traced(pid: int, out: Path, load: Awaitable[Any]) -> dict[str, list[float]]:
    """Trace ``pid``'s system calls while ``load`` runs; the waits of what was recorded."""
    perf = await asyncio.create_subprocess_exec(
        "perf",
        "record",
        "-q",
        "-e",
        "raw_syscalls:sys_enter,raw_syscalls:sys_exit",
        "-p",
        str(pid),
        "-o",
        str(out),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)  # perf attaches to a running process: give it time to start
        await load
    finally:
        with contextlib.suppress(ProcessLookupError):
            perf.send_signal(signal.SIGINT)
        await perf.wait()
    script = await asyncio.create_subprocess_exec(
        "perf", "script", "-i", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    text, _ = await script.communicate()
    return waits(text.decode(errors="replace").splitlines())


async def run(rate: float, seconds: float, rounds: int) -> dict[str, Any]:
    specs = [FLOOR_H2, EPP, EPP_PREFIX]
    requests = chat_requests(64, 1024, SEED)
    cells: dict[str, list[dict[str, float]]] = {s.name: [] for s in specs}
    with tempfile.TemporaryDirectory(prefix="bench-critical-") as tmp:
        async with Lab(specs) as lab:
            paths = list(lab.paths.values())
            for p in paths:
                await closed_loop(p.client(), requests, concurrency=8, duration=1.0)
            for r in range(rounds):
                order = paths[r % len(paths) :] + paths[: r % len(paths)]
                for p in order:
                    load = open_loop(p.client(), requests, rate=rate, duration=seconds, seed=SEED + r)
                    w = await _traced(p.pids["extproc"], Path(tmp) / f"{p.name}.{r}.data", load)
                    cells[p.name].append(medians(w))
                    log(f"critical path: round {r + 1}/{rounds} {p.name:<12} {cells[p.name][-1]}")
    added = added_over_floor(cells, FLOOR_H2.name, ("request", "response"))
    for by in added.values():
        parts = [v for v in by.values() if v is not None]
        by["exchange"] = rnd(sum(parts), 1) if len(parts) == 2 else None
    return {
        "settings": {"rate": rate, "seconds": seconds, "rounds": rounds, "request_bytes": len(requests[0])},
        "paths": {s.name: s.title for s in specs},
        "waits_us": cells,
        "added_over_floor_us": added,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.critical_path", description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests a second (open loop)")
    ap.add_argument("--seconds", type=float, default=4.0, help="each traced window")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if shutil.which("perf") is None:
        log("critical path: needs perf (linux-perf), which is not installed")
        return 2
    doc = asyncio.run(run(args.rate, args.seconds, args.rounds))
    write_result("critical_path", doc, mode="trace", seeds={"loadgen": SEED})
    for name, added in doc["added_over_floor_us"].items():
        print(f"{name}: waits added over the floor (µs, medians of rounds): {added}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
