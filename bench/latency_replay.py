"""Replay a traced accuracy run offline: TTFT MdAPE per load level in seconds, not minutes.

    python -m bench.latency --no-goodput --trace /tmp/t.jsonl      # records t.jsonl + t.client.jsonl
    python -m bench.latency_replay /tmp/t.jsonl [--learner ridge-log] [--capacity 1000] [--by-endpoint]

The trace (``EPP_LATENCY_TRACE``) has one JSON line per TTFT training row of the EPP: the first
chunk's time ``at`` (monotonic), the chosen endpoint, its feature row ``x`` at dispatch and the
TTFT the EPP measured.  The client file (written next to it by ``bench.latency --trace``) has the
bench's requests with their level and send time (``perf_counter``, the same clock on Linux).

The replay follows the producer's schedule: each row is predicted at its dispatch
(``at - ttft``) with the model of that moment, learnt at its first token, and the model is
trained every ``--interval`` seconds when rows arrived — through ``LatencyModel`` itself, so
what it prints is what the EPP would have predicted with the same rows.  Levels and the
warm-up (the first quarter of each level) are as in ``bench.latency``.  Errors are against the
EPP's TTFT (the training target); ``--client`` also matches each row to the client's request
and reports the error against the TTFT the client measured, which the online benchmark uses.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from epp.director.latency.model import (
    DEFAULT_LEARNER,
    LEARNERS,
    MIN_SAMPLES,
    N_FEATURES,
    FloatArray,
    LatencyModel,
    features,
)
from epp.director.latency.steps import StepClock


@dataclass(slots=True)
class Row:
    """One traced request: features at dispatch, when it was dispatched and when its first token came."""

    endpoint: str
    x: np.ndarray
    ttft_ms: float
    at: float  # first chunk at the EPP (monotonic s)
    level: int = -1
    in_warmup: bool = True
    client_ttft_ms: float | None = None
    predicted_ms: float | None = None

    @property
    def dispatched(self) -> float:
        return self.at - self.ttft_ms / 1000.0


@dataclass(slots=True)
class Trace:
    rows: list[Row]
    level_starts: list[float] = field(default_factory=list)


def load(path: Path, seconds: float) -> Trace:
    """The EPP's rows, with levels (and client TTFTs) from ``<path>.client.jsonl`` when present."""
    rows = []
    for line in path.read_bytes().splitlines():
        d = orjson.loads(line)
        rows.append(
            Row(d["endpoint"], np.asarray(d["x"], dtype=np.float64), float(d["ttft_ms"]), float(d["at"]))
        )
    rows.sort(key=lambda r: r.dispatched)
    trace = Trace(rows)
    client = path.with_suffix(".client.jsonl")
    if not client.exists():
        return trace
    recs = [orjson.loads(line) for line in client.read_bytes().splitlines()]
    levels = sorted({r["level"] for r in recs})
    # a level starts at its first send minus nothing measurable: the bench's Poisson clock starts there
    trace.level_starts = [min(r["sent"] - r["at"] for r in recs if r["level"] == lv) for lv in levels]
    for row in rows:
        lv = bisect.bisect_right(trace.level_starts, row.dispatched) - 1
        row.level = lv
        row.in_warmup = lv < 0 or row.dispatched - trace.level_starts[lv] < seconds / 4
    _match_client(rows, [r for r in recs if "ttft_ms" in r])
    return trace


def _match_client(rows: Sequence[Row], recs: Sequence[dict[str, float]]) -> None:
    """Pair each row with the client request sent just before the EPP saw it and answered after."""
    sent = np.array([r["sent"] for r in recs])
    first = sent + np.array([r["ttft_ms"] for r in recs]) / 1000.0
    order = np.argsort(sent)
    sent, first = sent[order], first[order]
    used = np.zeros(len(sent), dtype=bool)
    for row in sorted(rows, key=lambda r: r.dispatched):
        lo = int(np.searchsorted(sent, row.dispatched - 0.2))
        hi = int(np.searchsorted(sent, row.dispatched, side="right"))
        best, gap = -1, float("inf")
        for j in range(lo, hi):
            if used[j] or first[j] < row.at:
                continue
            g = (row.dispatched - sent[j]) + (first[j] - row.at)
            if g < gap:
                best, gap = j, g
        if best >= 0 and gap < 0.5:
            used[best] = True
            row.client_ttft_ms = 1000.0 * float(first[best] - sent[best])


def rebuild(x: FloatArray, clock: StepClock, now: float) -> FloatArray:
    """The row the producer builds today from a traced row's inputs and the endpoint's step clock.

    Every trace (15 or more columns) holds the raw inputs in its first 15 columns: scraped KV,
    waiting, running; in-flight requests and tokens; input tokens, uncached tokens, prefix
    fraction and the work ahead (pending prefill + own).
    """
    one = np.array
    rows: FloatArray = features(
        one([x[1]]), one([x[3]]), one([x[4]]), one([x[5]]), one([1000.0 * x[6]]), one([x[9]]), 1000.0 * x[7],
        one([1000.0 * (x[12] - x[8])]), one([clock.current]), one([clock.queued]), one([clock.elapsed(now)]),
        one([clock.rate]),
    )  # fmt: skip
    return np.asarray(rows[0], dtype=np.float64)


def replay(
    rows: Sequence[Row], model: LatencyModel, interval: float = 1.0, columns: int = N_FEATURES
) -> None:
    """Predict each row at dispatch, learn it at its first token, train every ``interval`` s.

    Features are rebuilt with today's ``features`` and a ``StepClock`` per endpoint fed with the
    traced requests, as the producer would have; ``columns`` keeps the first ones only (15: the
    model before the step features).
    """
    if not rows:
        return
    t0 = min(r.dispatched for r in rows)
    # events: (time, kind, index); kind 1 = learn, 2 = predict (a first token before a dispatch at a tie)
    events: list[tuple[float, int, int]] = []
    for i, r in enumerate(rows):
        events.append((r.dispatched, 2, i))
        events.append((r.at, 1, i))
    heapq.heapify(events)
    clocks: dict[str, StepClock] = {}
    xs: dict[int, tuple[np.ndarray, int]] = {}
    next_train = t0 + interval
    while events:
        t, kind, i = heapq.heappop(events)
        while t >= next_train:
            if model.pending:
                model.train()
            next_train += interval
        r = rows[i]
        clock = clocks.setdefault(r.endpoint, StepClock())
        uncached = 1000.0 * float(r.x[8])
        if kind == 2:
            x = rebuild(r.x, clock, t)[:columns]
            fit = model.fit
            r.predicted_ms = (
                None if fit is None or fit.samples[0] < MIN_SAMPLES else float(fit.predict(x[None, :])[0, 0])
            )
            xs[i] = (x, clock.dispatch(uncached, t))
        else:
            x, step = xs.pop(i)
            clock.first_token(step, uncached, t)
            model.add_ttft(x, r.ttft_ms)


def _stats(pairs: Sequence[tuple[float, float]]) -> str:
    if not pairs:
        return "      -"
    rel = [(p - a) / a for p, a in pairs]
    mdape = 100 * statistics.median(abs(e) for e in rel)
    return f"{mdape:5.1f}% ({100 * statistics.median(rel):+5.1f}) n={len(pairs)}"


def report(trace: Trace, by_endpoint: bool = False, client: bool = False) -> dict[int, float]:
    """Print MdAPE per level (after warm-up) and return it."""
    out: dict[int, float] = {}
    levels = sorted({r.level for r in trace.rows if r.level >= 0})
    for lv in levels:
        rows = [r for r in trace.rows if r.level == lv and not r.in_warmup and r.predicted_ms is not None]
        pairs = [(r.predicted_ms, r.ttft_ms) for r in rows if r.predicted_ms is not None]
        line = f"level {lv}: epp {_stats(pairs)}"
        if pairs:
            out[lv] = 100 * statistics.median(abs(p - a) / a for p, a in pairs)
        if client:
            cp = [
                (r.predicted_ms, r.client_ttft_ms)
                for r in rows
                if r.predicted_ms is not None and r.client_ttft_ms
            ]
            gap = [r.client_ttft_ms - r.ttft_ms for r in rows if r.client_ttft_ms]
            line += f" | client {_stats(cp)} gap p50 {statistics.median(gap) if gap else 0:.1f} ms"
        print(line)
        if by_endpoint:
            for ep in sorted({r.endpoint for r in rows}):
                ep_pairs = [(r.predicted_ms, r.ttft_ms) for r in rows if r.endpoint == ep and r.predicted_ms]
                print(f"    {ep}: {_stats(ep_pairs)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency_replay", description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, nargs="+")
    ap.add_argument("--learner", default=DEFAULT_LEARNER, choices=LEARNERS)
    ap.add_argument("--quantile", type=float, default=0.5)
    ap.add_argument("--capacity", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=12.0, help="seconds per level of the traced run")
    ap.add_argument(
        "--columns", type=int, default=N_FEATURES, help="features kept (15: before the step ones)"
    )
    ap.add_argument("--by-endpoint", action="store_true")
    ap.add_argument("--client", action="store_true", help="also the error against the client's TTFT")
    args = ap.parse_args(argv)
    for path in args.trace:
        trace = load(path, args.seconds)
        model = LatencyModel(args.capacity, args.learner, args.quantile, width=args.columns)
        replay(trace.rows, model, args.interval, args.columns)
        print(f"{path} ({len(trace.rows)} rows, {args.learner}, {args.columns} features)")
        report(trace, args.by_endpoint, args.client)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
