"""The lock-free metric classes export exactly what prometheus_client's would."""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
import threading
import time
from typing import Any

import prometheus_client as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from epp.metrics import fast
from epp.testing import waiting


def folded(child: fast.HistogramChild) -> tuple[list[int], float]:
    """The buckets and the sum as the folds have left them, without folding: read under the fold
    lock, so a fold another thread is in the middle of (its values already out of ``_pending``,
    not yet in the buckets) has ended."""
    with fast._FOLD_LOCK:
        return list(child._counts), child._sum


def test_histogram_buckets_are_le_and_cumulative() -> None:
    """A value on a bound counts in that bucket (le); buckets are cumulative; sum and count add up."""
    reg = CollectorRegistry()
    h = fast.Histogram("h_seconds", "help", ("a",), buckets=(0.1, 1.0), registry=reg)
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.labels("x").observe(v)
    get = reg.get_sample_value
    assert get("h_seconds_bucket", {"a": "x", "le": "0.1"}) == 2
    assert get("h_seconds_bucket", {"a": "x", "le": "1.0"}) == 4
    assert get("h_seconds_bucket", {"a": "x", "le": "+Inf"}) == 5
    assert get("h_seconds_count", {"a": "x"}) == 5
    assert get("h_seconds_sum", {"a": "x"}) == pytest.approx(8.65)


def test_exposition_matches_prometheus_client() -> None:
    """Same observations, same text (prometheus_client's _created samples aside)."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = fast.Histogram("lat_seconds", "Latency.", ("m",), buckets=(0.005, 0.5, 2), registry=ours)
    b = pc.Histogram("lat_seconds", "Latency.", ("m",), buckets=(0.005, 0.5, 2), registry=theirs)
    c1 = fast.Counter("reqs", "Requests.", ("m", "p"), registry=ours)
    c2 = pc.Counter("reqs", "Requests.", ("m", "p"), registry=theirs)
    g1 = fast.Gauge("running", "Running.", ("m",), registry=ours)
    g2 = pc.Gauge("running", "Running.", ("m",), registry=theirs)
    for v in (0.001, 0.3, 0.3, 9.0):
        a.labels("m1").observe(v)
        b.labels("m1").observe(v)
    c1.labels("m1", 2).inc(3)  # non-string label values are exported as strings, as upstream does
    c2.labels("m1", 2).inc(3)
    g1.labels("m1").inc()
    g1.labels("m1").dec(3)
    g2.labels("m1").inc()
    g2.labels("m1").dec(3)

    def strip(text: bytes) -> list[str]:
        return sorted(ln for ln in text.decode().splitlines() if "_created" not in ln)

    assert strip(generate_latest(ours)) == strip(generate_latest(theirs))


def test_labels_by_name_remove_and_errors() -> None:
    """Keyword labels equal positional ones; remove drops a series and its aliases; misuse raises."""
    reg = CollectorRegistry()
    c = fast.Counter("c", "h", ("x", "y"), registry=reg)
    c.labels(x=1, y="b").inc()
    c.labels("1", "b").inc()
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) == 2
    c.remove(1, "b")
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) is None
    c.labels(1, "b").inc()  # a fresh child after removal, not the stale alias
    assert reg.get_sample_value("c_total", {"x": "1", "y": "b"}) == 1
    with pytest.raises(ValueError, match="expected 2 label values"):
        c.labels("only-one")
    with pytest.raises(ValueError, match="non-negative"):
        c.labels("1", "b").inc(-1)


def test_unlabelled_metrics() -> None:
    """Metrics without labels take updates directly."""
    reg = CollectorRegistry()
    g = fast.Gauge("size", "h", registry=reg)
    g.set(42)
    h = fast.Histogram("d", "h", buckets=(1,), registry=reg)
    h.observe(0.5)
    assert reg.get_sample_value("size") == 42
    assert reg.get_sample_value("d_count") == 1


def test_gauge_set_function_is_read_at_each_scrape() -> None:
    """After ``set_function`` an unlabelled gauge exports the function's value at each scrape,
    as prometheus_client's does, and the value ``set`` before is no longer exported."""
    reg = CollectorRegistry()
    g = fast.Gauge("size", "h", registry=reg)
    g.set(42)
    sizes = [3]
    g.set_function(lambda: sizes[-1])
    assert reg.get_sample_value("size") == 3
    sizes.append(7)
    assert reg.get_sample_value("size") == 7
    with pytest.raises(AssertionError, match="unlabelled only"):
        fast.Gauge("labelled", "h", ("m",), registry=reg).set_function(lambda: 1)


def test_nan_observation_goes_to_inf_bucket_as_in_go() -> None:
    """Go's client (GIE's) counts a NaN observation in +Inf only; the sum becomes NaN."""
    reg = CollectorRegistry()
    h = fast.Histogram("h", "help", buckets=(1.0, 2.0), registry=reg)
    h.observe(math.nan)
    h.observe(0.5)
    assert reg.get_sample_value("h_bucket", {"le": "1.0"}) == 1
    assert reg.get_sample_value("h_bucket", {"le": "2.0"}) == 1
    assert reg.get_sample_value("h_bucket", {"le": "+Inf"}) == 2
    assert reg.get_sample_value("h_count") == 2
    assert math.isnan(reg.get_sample_value("h_sum") or 0.0)


def test_le_labels_are_formatted_as_go() -> None:
    """Bounds of a million and more are written Go's way (1e+06), as GIE's request-size buckets."""
    reg = CollectorRegistry()
    fast.Histogram("h", "help", buckets=(64.0, 1048576.0), registry=reg).observe(1)
    text = generate_latest(reg).decode()
    assert 'le="64.0"' in text
    assert 'le="1.048576e+06"' in text


# --- differential: random update sequences on ours and on prometheus_client ----------------------

LABEL_VALUES = st.one_of(
    st.text(max_size=4),  # any text: quotes, backslashes, newlines and non-ASCII are escaped alike
    st.sampled_from(("a", "b", 'q"uote', "back\\slash", "new\nline", "µ")),
    st.integers(-3, 3),  # non-string values are exported as str(value), as upstream
)
AMOUNTS = st.floats(allow_nan=False, allow_infinity=True, width=64) | st.integers(-(10**6), 10**6)
BOUNDS = st.lists(
    st.floats(0, 1e12, allow_nan=False) | st.sampled_from((1048576.0, 1e6, 999999.0, 1e-5, 0.1, 64.0)),
    min_size=1,
    max_size=6,
    unique=True,
).map(sorted)  # non-negative, as every EPP histogram's (see fast.py's docstring for negative bounds)
# (family, update, amount); family 0-2 are labelled, 3-5 the same kinds without labels.
KINDS = ("counter", "gauge", "histogram")
OPS = st.tuples(
    st.integers(0, 5),
    st.sampled_from(("inc", "dec", "set", "observe", "remove", "clear", "labels", "scrape")),
    st.lists(LABEL_VALUES, min_size=1, max_size=3),
    AMOUNTS | st.just(math.nan),
)


def _apply(family: Any, kind: str, labelled: bool, op: str, values: list[Any], amount: float) -> str:
    """One update on one family; the outcome as a caller sees it (ok, or the exception type)."""
    try:
        if op == "remove":
            if labelled and len(values) == 2:  # valid removals only: ours does not check the count
                family.remove(*values)
            return "ok"
        if op == "clear":
            if labelled:
                family.clear()
            return "ok"
        target = family.labels(*values) if labelled else family
        if op == "labels":
            return "ok"
        if kind == "counter" and op == "inc":
            target.inc(amount)
        elif kind == "gauge" and op in ("inc", "dec", "set"):
            getattr(target, op)(amount)
        elif kind == "histogram" and op == "observe" and not math.isnan(amount):
            target.observe(amount)  # NaN: see test_nan_observation_goes_to_inf_bucket_as_in_go
    except ValueError as e:
        return type(e).__name__
    return "ok"


def _families(registry: CollectorRegistry, lib: Any, bounds: list[float]) -> list[tuple[Any, str, bool]]:
    made = []
    for i, kind in enumerate(KINDS * 2):
        labelled = i < 3
        labelnames = ("x", "y") if labelled else ()
        cls = getattr(lib, kind.capitalize())
        extra = {"buckets": bounds} if kind == "histogram" else {}
        made.append((cls(f"m{i}", f"Help {i}.", labelnames, registry=registry, **extra), kind, labelled))
    return made


def _text(registry: CollectorRegistry) -> list[str]:
    return sorted(ln for ln in generate_latest(registry).decode().split("\n") if "_created" not in ln)


def check_against_prometheus_client(
    bounds: list[float], ops: list[tuple[int, str, list[Any], float]]
) -> None:
    ours_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    ours, theirs = _families(ours_reg, fast, bounds), _families(theirs_reg, pc, bounds)
    for index, op, values, amount in ops:
        if op == "scrape":  # mid-sequence: ours folds the observations pending so far
            assert _text(ours_reg) == _text(theirs_reg)
            continue
        (a, kind, labelled), (b, _, _) = ours[index], theirs[index]
        vals = values[:2] if len(values) >= 2 and op != "labels" else values
        assert _apply(a, kind, labelled, op, vals, amount) == _apply(b, kind, labelled, op, vals, amount)
    assert _text(ours_reg) == _text(theirs_reg)


@settings(max_examples=120, deadline=None)
@given(bounds=BOUNDS, ops=st.lists(OPS, max_size=30))
def test_random_updates_export_what_prometheus_client_exports(
    bounds: list[float], ops: list[tuple[int, str, list[Any], float]]
) -> None:
    """Any sequence of inc/dec/set/observe/labels/remove/clear on counters, gauges and histograms,
    labelled or not, gives prometheus_client's exposition text (``_created`` aside) and the
    same errors (negative counter increments, wrong label counts)."""
    check_against_prometheus_client(bounds, ops)


@pytest.mark.fuzz
@settings(max_examples=5000, deadline=None)
@given(bounds=BOUNDS, ops=st.lists(OPS, max_size=60))
def test_random_updates_export_what_prometheus_client_exports_long(
    bounds: list[float], ops: list[tuple[int, str, list[Any], float]]
) -> None:
    """The same, at length (``pytest -m fuzz``)."""
    check_against_prometheus_client(bounds, ops)


def test_pending_observations_fold_on_every_read_and_in_the_background() -> None:
    """``observe`` only appends; reads (``counts``, ``sum``, a scrape) and the fold thread fold,
    and a NaN or inf - inf among a batch takes the one-by-one path with Go's +Inf rule."""
    reg = CollectorRegistry()
    h = fast.Histogram("b", "help", buckets=(1.0, 10.0), registry=reg)
    child = h._default
    assert child is not None
    for v in (0.5, 5.0, 50.0, 1.0):
        h.observe(v)
    assert child.counts == [2, 1, 1] and child.sum == 56.5
    h.observe(math.nan)
    h.observe(2.0)
    assert child.counts == [2, 2, 2] and math.isnan(child.sum)
    h2 = fast.Histogram("c", "help", buckets=(1.0,), registry=reg)
    h2.observe(math.inf)
    h2.observe(-math.inf)
    assert reg.get_sample_value("c_bucket", {"le": "1.0"}) == 1
    assert reg.get_sample_value("c_bucket", {"le": "+Inf"}) == 2
    h2.observe(0.25)  # no reader: the fold thread folds it within FOLD_INTERVAL
    c2 = h2._default
    assert c2 is not None
    deadline = time.monotonic() + 10 * fast.FOLD_INTERVAL
    while c2._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not c2._pending and folded(c2)[0] == [2, 1]


class CountingLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_reads_take_the_fold_lock_even_with_nothing_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read with an empty pending list must still wait for a fold running on another thread:
    that fold has taken its values out of the list and not yet added them, so a read that skipped
    the lock would see the buckets without them, or the buckets with them and the sum without."""
    lock = CountingLock()
    monkeypatch.setattr(fast, "_FOLD_LOCK", lock)
    reg = CollectorRegistry()
    h = fast.Histogram("r", "help", buckets=(1.0,), registry=reg)
    child = h._default
    assert child is not None and not child._pending
    assert child.snapshot() == ([0, 0], 0.0)
    assert lock.taken == 1
    assert reg.get_sample_value("r_count") == 0  # a scrape
    assert lock.taken == 2


async def test_a_serving_loop_folds_and_the_fold_thread_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fold_on``: the loop folds every ``FOLD_INTERVAL`` (here each histogram in a callback of
    its own), the thread returns at its next wake instead of competing for the GIL, and the
    function it returns hands folding back to a thread."""
    monkeypatch.setattr(fast, "FOLD_INTERVAL", 0.01)
    monkeypatch.setattr(fast, "FOLD_SLICE", 0.0)
    reg = CollectorRegistry()
    children = []
    for i in range(3):
        h = fast.Histogram(f"h{i}", "help", buckets=(1.0,), registry=reg)
        assert h._default is not None
        children.append(h._default)
    loop = asyncio.get_running_loop()
    stop = fast.fold_on(loop)
    try:
        thread = fast._folder
        assert thread is not None
        await waiting.until(lambda: not thread.is_alive(), what="the fold thread to return")
        for round_ in range(1, 3):
            for c in children:
                c.observe(0.5)
                c.observe(2.0)
            await waiting.until(lambda: not any(c._pending for c in children), what="the loop's folds")
            assert all(folded(c) == ([round_, round_], 2.5 * round_) for c in children)
    finally:
        stop()
    assert fast._fold_loop is None
    restarted = fast._folder
    assert restarted is not None and restarted is not thread and restarted.is_alive()
    children[0].observe(0.25)
    await waiting.until(lambda: not children[0]._pending, what="the new thread's fold")
    assert folded(children[0])[0] == [3, 2]


async def test_a_value_that_is_no_number_loses_its_batch_and_the_folds_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad observation (a caller's bug) must not stop the loop's folds: the lists would grow."""
    monkeypatch.setattr(fast, "FOLD_INTERVAL", 0.01)
    h = fast.Histogram("bad", "help", buckets=(1.0,), registry=CollectorRegistry())
    child = h._default
    assert child is not None
    stop = fast.fold_on(asyncio.get_running_loop())
    try:
        child.observe("not a number")  # type: ignore[arg-type]
        child.observe(0.5)
        await waiting.until(lambda: not child._pending, what="the failed fold")
        assert folded(child)[0] == [0, 0]  # that batch is dropped
        child.observe(0.25)
        await waiting.until(lambda: not child._pending, what="the next fold")
        assert folded(child) == ([1, 0], 0.25)
    finally:
        stop()
    assert "histogram fold failed" in caplog.text


def test_a_fold_that_finds_the_values_taken_by_another_folder_does_nothing() -> None:
    """The fold thread and a reader may both see values pending; the one that gets the lock
    second finds none left (found by the suite: numpy's fold indexed an empty array)."""
    h = fast.Histogram("race", "help", buckets=(1.0,), registry=CollectorRegistry())
    child = h._default
    assert child is not None
    child.observe(0.5)
    errors: list[BaseException] = []

    def fold() -> None:
        try:
            child.fold()
        except BaseException as e:
            errors.append(e)

    source, first = inspect.getsourcelines(fast.HistogramChild.fold)
    lock_line = first + next(i for i, line in enumerate(source) if "with _FOLD_LOCK" in line)
    with fast._FOLD_LOCK:
        folder = threading.Thread(target=fold)
        folder.start()
        while True:  # until the folder waits for the lock, having seen the value pending
            frame = sys._current_frames().get(folder.ident or 0)
            if frame is not None and frame.f_code.co_name == "fold" and frame.f_lineno == lock_line:
                break
        child._pending.clear()  # as another folder would have
    folder.join()
    assert errors == [] and child._counts == [0, 0] and child._sum == 0.0


def test_equal_label_values_share_a_series() -> None:
    """Documented deviation: values equal by ``==`` (1, 1.0, True) share the first one's series."""
    reg = CollectorRegistry()
    c = fast.Counter("c", "h", ("x",), registry=reg)
    c.labels(1).inc()
    c.labels(1.0).inc()
    c.labels(True).inc()
    assert reg.get_sample_value("c_total", {"x": "1"}) == 3
    assert reg.get_sample_value("c_total", {"x": "1.0"}) is None
