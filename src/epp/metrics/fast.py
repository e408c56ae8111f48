"""Lock-free Counter, Gauge and Histogram for the request path, exported through prometheus_client.

prometheus_client takes a lock per update and scans histogram buckets linearly: 2.3 µs
per ``labels(...)`` plus ``observe`` on a 20-bucket histogram (1.7 µs for a counter's
``labels(...).inc()``), and the EPP records a dozen per request.  Here a label lookup is
one dict hit and an observation is a ``bisect`` plus two additions: 0.34 µs (0.24 µs),
measured again for issue #14, so it stays.  All updates happen on the event loop thread; the
``/metrics`` handler reads from a worker thread, which the GIL makes safe for these
plain int/float fields (a scrape may see an observation's count before its sum, as with
any lock-free reader).  Families register with a ``CollectorRegistry``, so exposition,
``get_sample_value`` and the text format are prometheus_client's own.  Like Go's client,
no ``_created`` samples are exported.

A leaf (an import-linter contract in pyproject.toml keeps it from importing the EPP), fenced
by a differential test (tests/metrics/test_fast.py): hypothesis-generated sequences of
updates on labelled and unlabelled counters, gauges and histograms, applied here and to
prometheus_client's classes (the reference), must export the same text.  Where the two differ on purpose:

- a NaN observation counts in the ``+Inf`` bucket (and in ``_count``) as in Go's client, which
  GIE uses; prometheus_client counts it in no bucket;
- label values are looked up by equality before being turned into strings, so values that
  are equal but print differently (``1``, ``1.0``, ``True``) share the series of the first one
  seen; prometheus_client keys by ``str(value)``.  Callers pass strings (or ints);
- a histogram with a negative bucket bound exports neither ``_count`` nor ``_sum``
  (prometheus_client's ``HistogramMetricFamily`` rule; its ``Histogram`` keeps ``_count``).
  No EPP histogram has one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, Generic, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

C = TypeVar("C")
log = logging.getLogger(__name__)

FOLD_INTERVAL: Final = 1.0  # seconds between two folds of every histogram's pending observations
FOLD_SLICE: Final = 0.0005  # a loop's fold yields to other callbacks after this long (seconds)
_FOLD_LOCK = threading.Lock()
_CHILDREN: weakref.WeakSet[HistogramChild] = weakref.WeakSet()
_folder: threading.Thread | None = None
_fold_loop: asyncio.AbstractEventLoop | None = None  # set: the folds run there, not in a thread


def fold_all() -> None:
    """Fold every histogram's pending observations (``HistogramChild.fold``)."""
    for child in list(_CHILDREN):
        _fold_logged(child)


def _fold_logged(child: HistogramChild) -> None:
    """``child.fold()``; a failure (a value that is no number: a caller's bug) loses that batch and
    is logged, and the folds go on: an exception must not end the thread or the loop's chain,
    after which every pending list would grow without bound."""
    try:
        child.fold()
    except Exception:
        log.exception("histogram fold failed: its pending observations were dropped")


def fold_on(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Fold on ``loop`` every ``FOLD_INTERVAL`` from now on, instead of in the fold thread; returns
    the function that hands folding back to a thread.

    Why: a thread that wants the GIL while the event loop holds it is woken at every release
    the loop makes (each pass through uvloop's poll) and goes back to waiting, for up to the
    5 ms switch interval, then forces a switch.  The fold thread did that ~2,000 times a second
    at capacity (``voluntary_ctxt_switches``): ~3% of a core in its own wake-ups, against
    ~0.1% of folding, and each release cost the loop a futex wake.  On the loop the folds cost
    only their work, in slices of at most ``FOLD_SLICE`` between other callbacks.
    """
    global _fold_loop
    _fold_loop = loop
    handle: list[asyncio.Handle] = []  # the next scheduled step, to cancel

    def tick() -> None:
        step(iter(list(_CHILDREN)))

    def step(children: Iterator[HistogramChild]) -> None:
        deadline = time.perf_counter() + FOLD_SLICE
        for child in children:
            _fold_logged(child)
            if time.perf_counter() > deadline:
                handle[:] = [loop.call_soon(step, children)]
                return
        handle[:] = [loop.call_later(FOLD_INTERVAL, tick)]

    def stop() -> None:
        global _fold_loop
        for h in handle:
            h.cancel()
        if _fold_loop is loop:
            _fold_loop = None
            if _CHILDREN and (_folder is None or not _folder.is_alive()):
                _start_folder()

    handle.append(loop.call_later(FOLD_INTERVAL, tick))
    return stop


def _fold_forever() -> None:
    while True:
        time.sleep(FOLD_INTERVAL)
        if _fold_loop is not None:  # a loop folds now (``fold_on``): this thread is done
            return
        fold_all()


def _register(child: HistogramChild) -> None:
    """Track ``child`` for the fold thread, started with the first histogram."""
    _CHILDREN.add(child)
    if _folder is None and _fold_loop is None:
        _start_folder()


def _start_folder() -> None:
    global _folder
    _folder = threading.Thread(target=_fold_forever, name="epp-metrics-fold", daemon=True)
    _folder.start()


def _after_fork() -> None:  # pragma: no cover - a forked child (workers exec instead)
    """A forked child has no fold thread and no loop: start its own thread if it has histograms."""
    global _folder, _fold_loop
    _folder = None
    _fold_loop = None
    if _CHILDREN:
        _start_folder()


os.register_at_fork(after_in_child=_after_fork)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild:
    """One histogram series.  ``observe`` is the bound ``append`` of a pending list (a C call, no
    Python frame: the request path observes ~25 values a request; ``array('d').append`` would
    keep no float object but parses its argument with a format string, ~400 instructions more
    each); the values are folded into the buckets and the sum whenever they are read
    (``counts``, ``sum``, a scrape) and at least every ``FOLD_INTERVAL`` seconds, by a daemon
    thread or, in a serving EPP, on its event loop (``fold_on``), which bounds the list.  A
    fold adds the values to the sum in observation order, so the floats are those of adding
    each value as it came (tests/metrics/test_fast.py holds it to prometheus_client's)."""

    __slots__ = ("__weakref__", "_bounds", "_counts", "_pending", "_sum", "observe")

    observe: Callable[[float], None]

    def __init__(self, bounds: np.ndarray[Any, np.dtype[np.float64]]) -> None:
        self._bounds = bounds  # sorted upper bounds, the last one +Inf (its family's one array)
        self._counts = [0] * len(bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._pending: list[float] = []
        self.observe = self._pending.append
        _register(self)

    @property
    def counts(self) -> list[int]:
        """Per-bucket counts (not cumulative), every observation so far included."""
        return self.snapshot()[0]

    @property
    def sum(self) -> float:
        return self.snapshot()[1]

    def snapshot(self) -> tuple[list[int], float]:
        """The counts (a copy) and the sum, every observation so far folded in, read together.

        Under the fold lock: a fold running on another thread has already taken the pending
        values out of the list, and until it ends its values are in neither the list nor the
        buckets (a scrape then would see the buckets and the sum disagree).
        """
        with _FOLD_LOCK:
            self._fold_held()
            return list(self._counts), self._sum

    def fold(self) -> None:
        """Move the pending observations into the buckets and the sum.

        Any thread may call it (the event loop observes, a ``/metrics`` worker or the fold
        thread folds): folds take one lock, and the loop's appends need none, since taking the
        first ``n`` values and deleting them are each one list operation under the GIL and a
        value appended between the two lands after ``n``.

        The values are copied once into a numpy array and the work is numpy's (9,000 values in
        0.27 ms, against 0.89 ms sorting and adding them one by one in Python; at capacity the
        request path observes ~25 values a request).
        ``searchsorted(side="left")`` is ``bisect_left`` (the first bound >= the value:
        Prometheus ``le``), and places a NaN after every bound, which lands in +Inf as Go counts
        it; ``add.accumulate`` adds left to right as ``observe``'s own additions would (no
        pairwise summation), so the sum's float is the same.
        """
        if not self._pending:
            return
        with _FOLD_LOCK:
            self._fold_held()

    def _fold_held(self) -> None:
        """``fold`` with ``_FOLD_LOCK`` held."""
        pending = self._pending
        n = len(pending)
        if not n:  # another folder took them between ``fold``'s test and the lock
            return
        values = pending[:n]
        del pending[:n]
        a = np.array(values, dtype=np.float64)
        counts = self._counts
        last = len(counts) - 1
        per_bucket = np.bincount(np.searchsorted(self._bounds, a), minlength=last + 2)
        for i, k in enumerate(per_bucket.tolist()):  # index last + 1: a NaN, after +Inf
            if k:
                counts[i if i < last else last] += k
        a[0] += self._sum  # the first addition (commutative), then the rest in order
        with np.errstate(all="ignore"):  # inf - inf is NaN here as in Python, without a warning
            self._sum = float(np.add.accumulate(a, out=a)[-1])


class _Family(Generic[C]):
    """A metric with its children by label values."""

    kind: ClassVar[str]

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lookup: dict[tuple[Any, ...], C] = {}  # raw label values (aliases) -> child
        self._children: dict[tuple[str, ...], C] = {}  # exported label values -> child
        self._default: C | None = None if self.labelnames else self._new_child()
        registry.register(self)

    def _new_child(self) -> C:
        raise NotImplementedError

    def labels(self, *values: Any, **kwargs: Any) -> C:
        if kwargs:
            if values:
                raise ValueError("pass label values either by position or by name")
            values = tuple(kwargs[n] for n in self.labelnames)
        child = self._lookup.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(
                    f"{self.name}: expected {len(self.labelnames)} label values, got {len(values)}"
                )
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
            self._lookup[values] = child
        return child

    def remove(self, *values: Any) -> None:
        child = self._children.pop(tuple(str(v) for v in values), None)
        if child is not None:
            for alias in [k for k, c in self._lookup.items() if c is child]:
                del self._lookup[alias]

    def clear(self) -> None:
        self._lookup.clear()
        self._children.clear()

    def _series(self) -> list[tuple[tuple[str, ...], C]]:
        if self._default is not None:
            return [((), self._default)]
        return list(self._children.items())  # one C-level copy: safe against the loop thread

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        yield self._fill(self._family())

    def _family(self) -> Metric:
        raise NotImplementedError

    def _fill(self, family: Metric) -> Metric:
        raise NotImplementedError


class Counter(_Family[CounterChild]):
    kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        assert self._default is not None, f"{self.name} has labels: use labels(...).inc()"
        self._default.inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _fill(self, family: Metric) -> Metric:
        assert isinstance(family, CounterMetricFamily)
        for values, child in self._series():
            family.add_metric(list(values), child.value)
        return family


class Gauge(_Family[GaugeChild]):
    kind = "gauge"

    # Unlabelled only: the value read at each scrape (``set_function``), instead of the child's.
    function: Callable[[], float] | None = None

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        assert self._default is not None, f"{self.name} has labels: use labels(...).set()"
        self._default.set(value)

    def set_function(self, fn: Callable[[], float]) -> None:
        """Export ``fn()`` at every scrape from now on (prometheus_client's ``set_function``): for a
        size the request path would otherwise set on every change.  ``fn`` runs on the scrape's
        thread, so it must only read."""
        assert self._default is not None, f"{self.name} has labels: set_function is unlabelled only"
        self.function = fn

    def inc(self, amount: float = 1.0) -> None:
        assert self._default is not None, f"{self.name} has labels: use labels(...).inc()"
        self._default.inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        assert self._default is not None, f"{self.name} has labels: use labels(...).dec()"
        self._default.dec(amount)

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _fill(self, family: Metric) -> Metric:
        assert isinstance(family, GaugeMetricFamily)
        if self.function is not None:
            family.add_metric([], float(self.function()))
            return family
        for values, child in self._series():
            family.add_metric(list(values), child.value)
        return family


class Histogram(_Family[HistogramChild]):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = np.asarray(bounds, dtype=np.float64)  # shared by the children's folds
        self._les = tuple(_le(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)
        # Unlabelled: the family's observe is its one series' (a list append, no Python frame).
        self.observe = self._labelled_observe if self._default is None else self._default.observe

    observe: Callable[[float], None]

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def _labelled_observe(self, value: float) -> None:
        raise AssertionError(f"{self.name} has labels: use labels(...).observe()")

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _fill(self, family: Metric) -> Metric:
        assert isinstance(family, HistogramMetricFamily)
        for values, child in self._series():
            counts, total = child.snapshot()
            running = 0
            buckets = []
            for le, n in zip(self._les, counts, strict=True):
                running += n
                buckets.append((le, running))
            family.add_metric(list(values), buckets, total)
        return family


# The ``le`` label as prometheus_client and Go's client write it: ``+Inf``, ``0.5``, ``1e+06``.
_le: Final[Callable[[float], str]] = floatToGoString
