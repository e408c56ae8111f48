"""The feature matrix of one request, assembled from per-endpoint rows kept up to date between requests.

``model.features`` defines the ``(n, N_FEATURES)`` matrix from per-endpoint inputs.  Most of
them do not depend on the request: the scraped KV-cache use, waiting and running requests,
and what this EPP has in flight on the endpoint (requests, tokens, queued prefill, its
``StepClock``).  Reading them from every candidate's ``Metrics`` and counters for every
request was half of PrepareData (eleven Python passes over the candidates, then a numpy
operation per column).  ``FeatureTable`` keeps them as rows of one array instead and
rewrites a row's values when they change, off the request path: a new ``Metrics``
(``Endpoint.add_metrics_listener``, five values) or a counter change the producer reports
(``touch``, eight values), each a few stores through a flat ``memoryview`` (well under a
µs, against tens of µs per request for reading them all).

A request then costs one gather of its candidates' rows (``take``: the matrix it owns), and
about fifteen numpy operations for the columns that depend on the request (its input and
uncached tokens, the products with them, the logs) or on the clock (how long the running
step has run).  Until they are computed, those columns' slots in a stored row hold the
inputs they are computed from (the queued prefill, the step's start, ...), so the one
gather brings both.

The result is bit-identical to ``features`` on the same inputs: every value is computed by
the same IEEE operations in the same order.  tests/director/latency/test_table.py holds the
straightforward builder as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from epp.datalayer.api import Endpoint, Metrics
from epp.datalayer.attributes import PrefixMatchInfo
from epp.director.latency.model import _KV_FULL, _MAX_ELAPSED_S, _WORK_OFFSET_K, N_FEATURES, FloatArray
from epp.director.latency.steps import StepClock

IntArray = np.ndarray[Any, np.dtype[np.intp]]

_FULL_SPAN: Final = 1.0 - _KV_FULL
_IDX_CACHE: Final = 8  # candidate lists whose row indices are kept (subsets by model, ...)
_W: Final = N_FEATURES  # a row's stride in the flat view

# Slots of a stored row.  Columns the request does not change hold their final value; the
# others hold, until ``assemble`` overwrites them, the input they are computed from.
_WORK: Final = 12  # stored: queued prefill (k tokens); request: + own uncached = work
_CURRENT: Final = 15  # the running step's prefill (k tokens)
_AHEAD: Final = 16  # stored: the next step's prefill (k tokens); request: + own uncached = ahead
_ELAPSED: Final = 17  # stored: when the running step started (s); request: seconds it has run, capped
_HAS_STEP: Final = 18  # stored: 1.0 when a step of ours is running, else 0.0; request: log(ahead)
_CAPPED: Final = 19  # stored: the running step's length at the recent prefill rate (s, inf if unknown)
_FULL: Final = 20


class Inflight:
    """What this EPP has in flight on one endpoint (requests, input tokens, prefill not yet done)."""

    __slots__ = ("prefill", "requests", "steps", "tokens")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.prefill = 0.0  # uncached input tokens of requests whose first token has not come back
        self.steps = StepClock()  # the same prefill by engine step: running now / queued behind


IDLE: Final = Inflight()


def prefix_fractions(
    prefix: Mapping[Hashable, PrefixMatchInfo], endpoints: Sequence[Endpoint]
) -> FloatArray | None:
    """Each candidate's prefix-match fraction, or None when every one is 0 (no information).

    One comprehension with the arithmetic inline: faster than a call per candidate, and at
    10-1000 candidates as fast as or faster than passes that find the few matched ones by
    identity (the prefix producer shares one object among the unmatched).
    """
    if not prefix:
        return None
    values = [
        p.match_blocks / p.total_blocks if p is not None and p.total_blocks > 0 else 0.0
        for p in map(prefix.get, endpoints)
    ]
    return np.array(values) if any(values) else None


class FeatureTable:
    """Per-endpoint stored rows, the ``Inflight`` counters they read, and the per-request assembly.

    Rows are keyed by ``Endpoint`` object (its ``Metrics`` are per object) and counters by
    name (as the producer keeps them).  An endpoint gets a row the first time it is a
    candidate, and gives it back at ``remove``.  The table listens to its endpoints' metrics
    (held weakly by them), so it must stay referenced by its owner.
    """

    __slots__ = (
        "__weakref__",
        "_by_name",
        "_flat",
        "_free",
        "_idx",
        "_last",
        "_last_idx",
        "_row",
        "_rows",
        "counters",
    )

    def __init__(self, capacity: int = 64) -> None:
        self.counters: dict[str, Inflight] = {}
        self._rows: FloatArray = np.zeros((capacity, N_FEATURES))
        self._flat = _flat(self._rows)
        self._row: dict[Endpoint, int] = {}
        self._by_name: dict[str, list[int]] = {}
        self._free = list(range(capacity - 1, -1, -1))
        self._idx: dict[tuple[Endpoint, ...], IntArray] = {}
        self._last: tuple[Endpoint, ...] | None = None  # the last candidate tuple and its indices
        self._last_idx: IntArray | None = None

    # change notifications -------------------------------------------------------------------
    def metrics_stored(self, endpoint: Endpoint) -> None:
        """``MetricsListener``: the endpoint stored a new reading; its row takes it now."""
        row = self._row.get(endpoint)
        if row is not None:
            self._write_metrics(row * _W, endpoint.metrics)

    def touch(self, name: str) -> None:
        """The counter of ``name`` changed (a dispatch, a first token, a completion): its rows take it."""
        rows = self._by_name.get(name)
        if rows:
            c = self.counters.get(name, IDLE)
            for row in rows:
                self._write_counter(row * _W, c)

    def counter(self, name: str) -> Inflight:
        """The endpoint's counter, created on first use (the caller ``touch``es after changing it)."""
        c = self.counters.get(name)
        if c is None:
            c = self.counters[name] = Inflight()
        return c

    def remove(self, endpoint: Endpoint) -> None:
        """The endpoint left the pool: its counter goes, its row is given back."""
        name = endpoint.metadata.name
        self.counters.pop(name, None)
        self.touch(name)  # another object of the same name keeps a row: it reads idle counters now
        row = self._row.pop(endpoint, None)
        if row is None:
            return
        endpoint.remove_metrics_listener(self)
        rows = self._by_name[name]
        rows.remove(row)
        if not rows:
            del self._by_name[name]
        self._free.append(row)
        self._idx.clear()  # cached indices may point at the row
        self._last = self._last_idx = None

    # the request path -----------------------------------------------------------------------
    def indices(self, endpoints: Sequence[Endpoint]) -> IntArray:
        """The candidates' rows (cached per candidate tuple: the datastore hands out the same one)."""
        if endpoints is self._last and self._last_idx is not None:
            return self._last_idx
        cand = endpoints if type(endpoints) is tuple else tuple(endpoints)
        idx = self._idx.get(cand)
        if idx is None:
            row = self._row
            idx = np.fromiter((row[ep] if ep in row else self._add(ep) for ep in cand), np.intp, len(cand))
            if len(self._idx) >= _IDX_CACHE:
                self._idx.clear()
            self._idx[cand] = idx
        self._last, self._last_idx = cand, idx
        return idx

    def assemble(
        self, endpoints: Sequence[Endpoint], input_tokens: float, fraction: FloatArray | None, now: float
    ) -> FloatArray:
        """The request's ``(n, N_FEATURES)`` matrix (a new array: the request keeps it).

        ``fraction``: each candidate's prefix-match fraction (None: all 0); ``now``: the
        monotonic clock the running steps' durations are measured to.
        """
        idx = self.indices(endpoints)  # first: it may add rows (and grow the array)
        x: FloatArray = self._rows.take(idx, axis=0)
        input_k = input_tokens / 1000.0
        both = x[:, _WORK : _AHEAD + 1 : _AHEAD - _WORK]  # work and ahead: a (n, 2) view
        if fraction is None:  # input_k * (1 - 0) is input_k exactly
            x[:, 7:10] = (input_k, input_k, 0.0)  # input, uncached, prefix fraction
            np.multiply(x[:, 4:2:-1], input_k, out=x[:, 10:12])  # running, waiting x input
            np.add(both, input_k, out=both)
        else:
            uncached = input_k * (1.0 - fraction)
            x[:, 7] = input_k
            x[:, 8] = uncached
            x[:, 9] = fraction
            np.multiply(x[:, 4], uncached, out=x[:, 10])
            np.multiply(x[:, 3], input_k, out=x[:, 11])
            np.add(both, uncached[:, None], out=both)
        np.multiply(x[:, 4], x[:, _WORK], out=x[:, 14])
        elapsed = x[:, _ELAPSED]
        np.subtract(now, elapsed, out=elapsed)
        np.multiply(elapsed, x[:, _HAS_STEP], out=elapsed)  # 0 with no running step
        np.minimum(elapsed, _MAX_ELAPSED_S, out=elapsed)
        np.minimum(elapsed, x[:, _CAPPED], out=x[:, _CAPPED])
        np.log(np.add(both, _WORK_OFFSET_K), out=x[:, 13 : _HAS_STEP + 1 : _HAS_STEP - 13])  # log work, ahead
        # the full-KV hinge times ahead, work (columns 16, 12: a view backwards) and elapsed
        np.multiply(x[:, _FULL : _FULL + 1], x[:, _AHEAD : _WORK - 1 : _WORK - _AHEAD], out=x[:, 21:23])
        np.multiply(x[:, _FULL], elapsed, out=x[:, 23])
        return x

    # upkeep -------------------------------------------------------------------------------
    def _write_metrics(self, o: int, m: Metrics) -> None:
        f = self._flat
        kv = m.kv_cache_usage_percent
        f[o + 1] = kv
        f[o + 2] = kv * kv
        f[o + 3] = m.waiting_queue_size
        f[o + 4] = m.running_requests_size
        f[o + _FULL] = max(kv - _KV_FULL, 0.0) / _FULL_SPAN

    def _write_counter(self, o: int, c: Inflight) -> None:
        f = self._flat
        s = c.steps
        current_k = s.current / 1000.0
        rate = s.rate
        f[o + 5] = c.requests
        f[o + 6] = c.tokens / 1000.0
        f[o + _WORK] = c.prefill / 1000.0
        f[o + _CURRENT] = current_k
        f[o + _AHEAD] = s.queued / 1000.0
        f[o + _ELAPSED] = s.started
        f[o + _HAS_STEP] = 1.0 if s.current > 0 else 0.0
        f[o + _CAPPED] = current_k * 1000.0 / max(rate, 1.0) if rate > 0 else math.inf

    def _add(self, endpoint: Endpoint) -> int:
        if not self._free:
            self._grow()
        row = self._free.pop()
        self._row[endpoint] = row
        self._by_name.setdefault(endpoint.metadata.name, []).append(row)
        o = row * _W
        self._flat[o] = 1.0  # the bias
        self._write_metrics(o, endpoint.metrics)
        self._write_counter(o, self.counters.get(endpoint.metadata.name, IDLE))
        endpoint.add_metrics_listener(self)
        return row

    def _grow(self) -> None:
        old = self._rows.shape[0]
        self._flat.release()
        self._rows = np.concatenate([self._rows, np.zeros((old, N_FEATURES))])
        self._flat = _flat(self._rows)
        self._free.extend(range(2 * old - 1, old - 1, -1))


def _flat(rows: FloatArray) -> memoryview[float]:
    """A flat float view of ``rows``: storing one value through it costs a few tens of ns."""
    return rows.data.cast("B").cast("d")
