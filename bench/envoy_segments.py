"""Where a request's time goes on Envoy's own clock, per path at a low rate: the added p50, by segment.

    python -m bench.envoy_segments [--rate 200] [--seconds 2] [--rounds 5]

``bench.overhead`` measures the client's whole latency, and ``bench.critical_path`` the ext_proc
server's answers (from each read to the write that answers it).  Neither sees what lies between:
how long Envoy waits from handing a message to the kernel until the answer is back (the server's
wake-up and whatever else it was doing, the proxy's own wake-up), and the proxy's work around
the exchange.  Envoy's access log can: ``%COMMON_DURATION(A:B:us)%`` between its own time points,
for every request.  Segments (Envoy's names for the points):

* ``downstream``: DS_RX_BEG -> DS_RX_END, the client's request read whole;
* ``request``: DS_RX_BEG -> US_TX_BEG, the request phases with the ext_proc server, the host chosen,
  the first byte sent upstream;
* ``upstream``: US_TX_BEG -> US_RX_BEG, the model server's answer (the near-instant upstreams);
* ``response_headers``: US_RX_BEG -> DS_TX_BEG, the response headers' phase, until the first byte
  goes to the client;
* ``response_body``: DS_TX_BEG -> DS_TX_END;
* ``total``: DS_RX_BEG -> DS_TX_END.

Paths as bench/overhead builds them (the no-op floor on the EPP's transport, the EPP with the
default and the prefix-heavy configs, all under GIE's Envoy config), open-loop Poisson load at
``--rate``, paths interleaved within a round and their order rotated.  Per path and round the
median of each segment; per EPP path its medians over the floor's, per round, and their median
over the rounds.  Compared with bench.critical_path's waits, the difference is the time outside
the server's read -> write windows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from bench.common import added_over_floor, log, write_result
from bench.httpload import closed_loop, open_loop
from bench.overhead import SEED, chat_requests
from bench.paths import EPP, EPP_PREFIX, FLOOR_H2, Lab, PathSpec

SEGMENTS: Final = ("downstream", "request", "upstream", "response_headers", "response_body", "total")
_POINTS: Final = (
    ("DS_RX_BEG", "DS_RX_END"),
    ("DS_RX_BEG", "US_TX_BEG"),
    ("US_TX_BEG", "US_RX_BEG"),
    ("US_RX_BEG", "DS_TX_BEG"),
    ("DS_TX_BEG", "DS_TX_END"),
    ("DS_RX_BEG", "DS_TX_END"),
)
# One line a request: a tag, the start (epoch seconds), the response code, then the segments in µs.
TAG: Final = "SEG"
FORMAT: Final = (
    f"{TAG} %START_TIME(%s.%6f)% %RESPONSE_CODE% "
    + " ".join(f"%COMMON_DURATION({a}:{b}:us)%" for a, b in _POINTS)
    + "\n"
)
FLUSH_S: Final = 1.0  # the demo Envoy writes its access log every 100 ms (--file-flush-interval-msec)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One request as Envoy logged it."""

    start: float  # epoch seconds
    status: int
    us: tuple[int, ...]  # SEGMENTS, in order


def rows(lines: Iterable[str]) -> list[Row]:
    """The ``FORMAT`` lines of an access log; others, and requests with a segment Envoy could not
    time (``-``: e.g. no upstream reached), are skipped."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3 + len(SEGMENTS) or parts[0] != TAG:
            continue
        try:
            us = tuple(int(x) for x in parts[3:])
            out.append(Row(float(parts[1]), int(parts[2]), us))
        except ValueError:
            continue
    return out


def medians(window: Sequence[Row]) -> dict[str, float]:
    """Each segment's median over the successful requests of one window (µs)."""
    ok = [r for r in window if r.status == 200]
    if not ok:
        return {}
    return {seg: float(statistics.median(r.us[i] for r in ok)) for i, seg in enumerate(SEGMENTS)}


def logged(spec: PathSpec, directory: Path) -> PathSpec:
    """``spec`` with its Envoy writing ``FORMAT`` to a file of its own in ``directory``."""
    path = directory / f"{spec.name}.log"
    envoy = (*spec.envoy, ("access_log", str(path)), ("access_log_format", FORMAT))
    return dataclasses.replace(spec, envoy=envoy)


async def run(rate: float, seconds: float, rounds: int) -> dict[str, Any]:
    requests = chat_requests(64, 1024, SEED)
    windows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-segments-") as tmp:
        specs = [logged(s, Path(tmp)) for s in (FLOOR_H2, EPP, EPP_PREFIX)]
        async with Lab(specs) as lab:
            paths = list(lab.paths.values())
            windows = {p.name: [] for p in paths}
            for p in paths:
                await closed_loop(p.client(), requests, concurrency=8, duration=1.0)
            for r in range(rounds):
                order = paths[r % len(paths) :] + paths[: r % len(paths)]
                for p in order:
                    t0 = time.time()
                    await open_loop(p.client(), requests, rate=rate, duration=seconds, seed=SEED + r)
                    windows[p.name].append((t0, time.time()))
            await asyncio.sleep(FLUSH_S)  # the last lines reach the files
            logs = {s.name: rows((Path(tmp) / f"{s.name}.log").read_text().splitlines()) for s in specs}
    cells: dict[str, list[dict[str, float]]] = {}
    for name, spans in windows.items():
        cells[name] = [medians([x for x in logs[name] if t0 <= x.start <= t1]) for t0, t1 in spans]
        for r, cell in enumerate(cells[name]):
            log(f"envoy segments: round {r + 1}/{rounds} {name:<12} {cell}")
    return {
        "settings": {"rate": rate, "seconds": seconds, "rounds": rounds, "request_bytes": len(requests[0])},
        "paths": {s.name: s.title for s in (FLOOR_H2, EPP, EPP_PREFIX)},
        "segments": {seg: f"{a} -> {b}" for seg, (a, b) in zip(SEGMENTS, _POINTS, strict=True)},
        "medians_us": cells,
        "added_over_floor_us": added_over_floor(cells, FLOOR_H2.name, SEGMENTS),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.envoy_segments", description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests a second (open loop)")
    ap.add_argument("--seconds", type=float, default=2.0, help="each path's window per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    doc = asyncio.run(run(args.rate, args.seconds, args.rounds))
    write_result("envoy_segments", doc, mode="access-log", seeds={"loadgen": SEED})
    for name, by in doc["added_over_floor_us"].items():
        print(f"{name}: added over the floor on Envoy's clock (µs, medians of rounds): {by}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
