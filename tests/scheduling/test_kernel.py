"""The fused plan's scoring in C (``_kernel.c``) against its reference, the Python scorers and
``combine`` as ``FusedPlan.totals`` runs them: totals equal bit for bit on hypothesis input.

Also: this machine built the extension (CI runs on the same kind: the C path is the one tested,
never a silent fallback), the build is of the current source, a case where a fused multiply-add
would round differently gives Python's float, inputs outside what C computes exactly give None
(the caller's cue to run Python), errors keep their type, calls leak nothing, and
EPP_PURE_PYTHON=1 selects Python.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import os
import struct
import sys
from collections.abc import Hashable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datalayer.attributes import (
    INFLIGHT_LOAD,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    InFlightLoad,
    PrefixMatchInfo,
)
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling import kernel
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.scheduling.weighting import combine
from epp.testing.plugins import build
from tests.native_ext import TOLERANCE, printed_with, traced_growth
from tests.scheduling.builders import request

SOURCE = Path(kernel.__file__).with_name("_kernel.c")


def native() -> Any:
    assert kernel.NATIVE is not None, f"the C kernel is not built on this machine: {kernel.REASON}"
    return kernel.NATIVE


def test_the_extension_is_built_here_and_is_the_current_source() -> None:
    """A failed build falls back silently at install (a warning pip hides): this test does not."""
    assert kernel.NATIVE is not None, kernel.REASON
    if os.environ.get(kernel.PURE_PYTHON_ENV, "") in ("", "0"):
        assert kernel.IMPLEMENTATION == "c"
        assert kernel.Plan is kernel.NATIVE.Plan
    assert hashlib.sha256(SOURCE.read_bytes()).hexdigest() == kernel.BUILT_FROM, (
        "the compiled _kernel is older than _kernel.c: rebuild it (pip install -e .)"
    )
    c = kernel.NATIVE
    assert (c.CACHED, c.PREFIX, c.TOKEN, c.PREFILL) == (
        kernel.CACHED,
        kernel.PREFIX,
        kernel.TOKEN,
        kernel.PREFILL,
    )


# --- the reference: FusedPlan.totals' Python path -----------------------------------------------


class Case:
    """One request's inputs: the endpoints, the cycle state, the scorers and the ops over them."""

    def __init__(
        self,
        eps: list[Endpoint],
        state: CycleState,
        req: InferenceRequest,
        ops: list[tuple[int, int, float, float]],
        partial: list[float] | None,
        cached: list[Any],
        backlog: dict[str, int],
    ) -> None:
        self.eps, self.state, self.req, self.ops = eps, state, req, ops
        self.partial, self.cached, self.backlog = partial, cached, backlog
        self.prefix: PrefixCacheScorer = build(PrefixCacheScorer)
        self.prefill: PrefillLoadScorer = build(PrefillLoadScorer)
        self.prefill._backlog = backlog
        self.tokens = {
            cap: build(TokenLoadScorer, queueThresholdTokens=int(cap)) for _, _, _, cap in ops if cap > 0
        }

    def python(self) -> list[float]:
        """The totals as ``FusedPlan.totals`` makes them without the kernel: groups of lists
        ``combine`` adds, the prefix scorer accumulating into them, a tail."""
        state, req, eps, n = self.state, self.req, self.eps, len(self.eps)
        partial = self.partial
        lists: list[Sequence[float]] = []
        weights: list[float] = []
        grouped = False
        for kind, slot, w, cap in self.ops:
            if kind == kernel.PREFIX:
                if lists:
                    partial = combine(lists, weights, n, partial)
                    lists, weights = [], []
                partial = self.prefix.add_weighted_scores(state, req, eps, partial, w)
                grouped = True
                continue
            if kind == kernel.CACHED:
                lists.append(self.cached[slot])
            elif kind == kernel.TOKEN:
                lists.append(self.tokens[cap].score(state, req, eps))
            else:
                lists.append(self.prefill.score(state, req, eps))
            weights.append(w)
        if lists:
            return combine(lists, weights, n, partial)
        if grouped:
            return partial  # type: ignore[return-value]
        return combine((), (), n, partial)

    def c(self, eps: Sequence[Endpoint] | None = None) -> list[float] | None:
        prompt = self.req.prompt_token_count
        state = self.state
        totals: list[float] | None = (
            native()
            .Plan(self.ops)
            .totals(
                self.eps if eps is None else eps,
                self.partial,
                self.cached,
                state.attributes(PREFIX_MATCH),
                state.attributes(INFLIGHT_LOAD),
                state.attributes(PRECISE_PREFIX_MATCH),  # taken over PREFIX_MATCH when not empty
                self.backlog,
                prompt,
            )
        )
        return totals


def bits(xs: Sequence[float]) -> list[bytes]:
    """The floats' exact bits: ``==`` would take -0.0 for 0.0 and never NaN for NaN."""
    return [struct.pack("<d", x) for x in xs]


def endpoint(i: int) -> Endpoint:
    return Endpoint(EndpointMetadata(name=f"ns/pod-{i}", address=f"10.0.0.{i}", port=8000, pod_name=str(i)))


WEIGHTS = st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 0.5, 0.1, 1.7, 1e-3, -0.0, -1.5]) | st.floats(
    -10.0, 10.0, allow_nan=False
)
SCORES = st.sampled_from([0.0, 1.0, 0.5, 0.1, 1 / 3, -0.0]) | st.floats(0.0, 1.0)
BLOCKS = st.sampled_from([0, 1, 4, 16, 7]) | st.integers(-2, 200)
TOKENS = st.sampled_from([0, -5, 1, 59_999, 60_000, 60_001, 10**9]) | st.integers(-10, 200_000)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 16))
    eps = [endpoint(i) for i in range(n)]
    state = CycleState()
    for key in (PREFIX_MATCH, PRECISE_PREFIX_MATCH):
        if draw(st.booleans()) if key is PREFIX_MATCH else draw(st.integers(0, 3)) == 0:
            total = draw(BLOCKS)
            common = PrefixMatchInfo(0, total, draw(st.sampled_from([0, 16, 64])))
            infos: dict[Hashable, PrefixMatchInfo] = {}
            for ep in eps:
                how = draw(st.integers(0, 3))  # absent, the shared object, its own, its own and odd
                if how == 1:
                    infos[ep] = common
                elif how == 2:
                    infos[ep] = PrefixMatchInfo(
                        draw(st.integers(0, max(total, 0))), total, common.block_size_tokens
                    )
                elif how == 3:
                    infos[ep] = PrefixMatchInfo(draw(BLOCKS), draw(BLOCKS), draw(st.integers(-4, 100)))
            state.set_attributes(key, infos)
    if draw(st.booleans()):
        state.set_attributes(
            INFLIGHT_LOAD,
            {
                ep: InFlightLoad(draw(st.integers(0, 5)), draw(TOKENS))
                for ep in eps
                if draw(st.integers(0, 4))
            },
        )
    backlog: dict[str, int] = {}
    if draw(st.booleans()):
        for ep in eps:
            if draw(st.booleans()):
                backlog[ep.metadata.name] = draw(st.sampled_from([0, 100, 4096]) | st.integers(0, 10**6))
    req = request(request_id="k")
    req.prompt_token_count = draw(st.sampled_from([0, 1, 64, 1000, 4096]) | st.integers(0, 10**6))
    cached = [draw(st.lists(SCORES, min_size=n, max_size=n)) for _ in range(draw(st.integers(0, 3)))]
    ops: list[tuple[int, int, float, float]] = []
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from([kernel.CACHED, kernel.PREFIX, kernel.TOKEN, kernel.PREFILL]))
        if kind == kernel.CACHED and not cached:
            continue
        slot = draw(st.integers(0, len(cached) - 1)) if kind == kernel.CACHED else 0
        cap = float(draw(st.sampled_from([60_000, 4_194_304, 1, 7]))) if kind == kernel.TOKEN else 0.0
        ops.append((kind, slot, draw(WEIGHTS), cap))
    partial = draw(st.none() | st.lists(st.floats(-20.0, 20.0), min_size=n, max_size=n))
    return Case(eps, state, req, ops, partial, cached, backlog)


@settings(max_examples=1500, deadline=None)
@given(case=cases())
def test_totals_equal_the_python_scorers_bit_for_bit(case: Case) -> None:
    want = case.python()
    got = case.c()
    assert got is not None
    assert bits(got) == bits(want)
    assert bits(case.c(tuple(case.eps)) or []) == bits(got)  # a tuple of endpoints as a list


@settings(max_examples=300, deadline=None)
@given(case=cases(), weight=st.floats(allow_nan=True, allow_infinity=True))
def test_any_weight_even_nan_or_infinite_gives_python_s_bits(case: Case, weight: float) -> None:
    case.ops = [(k, s, weight, c) for k, s, _, c in case.ops]
    got = case.c()
    assert got is not None
    assert bits(got) == bits(case.python())


def test_where_a_fused_multiply_add_would_round_once_the_kernel_rounds_twice() -> None:
    """``t + s * w`` is two roundings in Python; an FMA's one rounding differs here, so a build
    contracting it (no -ffp-contract=off, no pragma) would fail this test on an FMA machine."""
    t, match, total, w = 0.3, 1, 10, 3.0  # prefix score 0.1, weighted 0.30000000000000004
    s = match / total
    fused = float(Fraction(t) + Fraction(s) * Fraction(w))  # exact, rounded once
    assert fused != t + s * w, "not a case where contraction changes a bit"
    ep = endpoint(0)
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {ep: PrefixMatchInfo(match, total, 16)})
    got = (
        native()
        .Plan([(kernel.PREFIX, 0, w, 0.0)])
        .totals([ep], [t], [], state.attributes(PREFIX_MATCH), {}, {}, {}, 0)
    )
    assert got is not None
    assert bits(got) == bits([t + s * w])
    # the same with a cached list (``combine``'s ``p + a * wa``)
    got = native().Plan([(kernel.CACHED, 0, w, 0.0)]).totals([ep], [t], [[s]], {}, {}, {}, {}, 0)
    assert got is not None
    assert bits(got) == bits([t + s * w])


def test_all_equal_prefill_estimates_score_one_each() -> None:
    eps = [endpoint(i) for i in range(5)]
    got = native().Plan([(kernel.PREFILL, 0, 2.0, 0.0)]).totals(eps, None, [], {}, {}, {}, {}, 700)
    assert got == [2.0] * 5


# --- what C does not compute exactly: None, the Python path decides -------------------------------

BIG = 2**53 + 1


@pytest.mark.parametrize(
    "where",
    [
        "match_blocks",
        "total_blocks",
        "tokens",
        "prompt",
        "backlog",
        "prefill_overflow",
        "float_info",
        "score_int",
    ],
)
def test_values_c_cannot_compute_exactly_give_none(where: str) -> None:
    eps = [endpoint(0), endpoint(1)]
    infos: dict[Hashable, Any] = {eps[0]: PrefixMatchInfo(1, 4, 16)}
    loads: dict[Hashable, Any] = {eps[0]: InFlightLoad(1, 5)}
    backlog = {eps[0].metadata.name: 3}
    cached: list[Any] = [[0.5, 0.25]]
    prompt = 100
    if where == "match_blocks":
        infos[eps[1]] = PrefixMatchInfo(BIG, BIG + 1, 16)
    elif where == "total_blocks":
        infos[eps[1]] = PrefixMatchInfo(1, BIG, 16)
    elif where == "tokens":
        loads[eps[1]] = InFlightLoad(1, BIG)
    elif where == "prompt":
        prompt = 2**64
    elif where == "backlog":
        backlog[eps[1].metadata.name] = 2**70
    elif where == "prefill_overflow":
        infos[eps[1]] = PrefixMatchInfo(2**40, 4, 2**40)
    elif where == "float_info":
        infos[eps[1]] = PrefixMatchInfo(1.0, 4, 16)  # type: ignore[arg-type]
    else:
        cached = [[0.5, 1]]
    ops = [
        (kernel.CACHED, 0, 1.0, 0.0),
        (kernel.PREFIX, 0, 2.0, 0.0),
        (kernel.TOKEN, 0, 1.0, 60_000.0),
        (kernel.PREFILL, 0, 1.0, 0.0),
    ]
    plan = native().Plan(ops)
    assert plan.totals(eps, None, cached, infos, loads, infos, backlog, prompt) is None
    assert (
        plan.totals(eps, None, [[0.5, 0.25]], {eps[0]: PrefixMatchInfo(1, 4, 16)}, {}, {}, {}, 100)
        is not None
    )


def test_containers_other_than_list_tuple_dict_give_none() -> None:
    eps = [endpoint(0)]
    plan = native().Plan([(kernel.CACHED, 0, 1.0, 0.0), (kernel.PREFIX, 0, 1.0, 0.0)])
    assert plan.totals(iter(eps), None, [[0.5]], {}, {}, {}, {}, 0) is None
    assert plan.totals(eps, None, [[0.5]], CycleState(), {}, {}, {}, 0) is None  # a dict subclass
    assert plan.totals(eps, None, [(0.5,)], {}, {}, {}, {}, 0) == [0.5]
    assert plan.totals(eps, (0.25,), [[0.5]], {}, {}, {}, {}, 0) == [0.75]


def test_errors_keep_the_python_paths_types() -> None:
    eps = [endpoint(0), endpoint(1)]
    prefix = native().Plan([(kernel.PREFIX, 0, 1.0, 0.0)])
    with pytest.raises(AttributeError):
        prefix.totals(eps, None, [], {eps[1]: object()}, {}, {}, {}, 0)
    with pytest.raises(AttributeError):
        native().Plan([(kernel.TOKEN, 0, 1.0, 5.0)]).totals(eps, None, [], {}, {eps[0]: "x"}, {}, {}, 0)
    with pytest.raises(IndexError):  # ``combine`` indexes range(n)
        native().Plan([(kernel.CACHED, 0, 1.0, 0.0)]).totals(eps, None, [[0.5]], {}, {}, {}, {}, 0)
    with pytest.raises(IndexError):
        native().Plan([(kernel.CACHED, 0, 1.0, 0.0)]).totals(eps, [0.5], [[0.5, 0.5]], {}, {}, {}, {}, 0)
    with pytest.raises(TypeError):
        prefix.totals(eps, None)
    with pytest.raises(ValueError, match="kind"):
        native().Plan([(9, 0, 1.0, 0.0)])
    with pytest.raises(ValueError, match="cap"):
        native().Plan([(kernel.TOKEN, 0, 1.0, 0.0)])
    with pytest.raises(TypeError):
        native().Plan([("prefix", 0, 1.0, 0.0)])


# --- memory -----------------------------------------------------------------------------------


HUGE = 2**70 + 3  # a backlog C cannot take: its reference count is watched


def _calls(count: int) -> None:
    eps = [endpoint(i) for i in range(20)]  # more than the stack buffers: the heap path too
    shared = PrefixMatchInfo(0, 8, 16)
    infos = {ep: (shared if i % 2 else PrefixMatchInfo(i % 8, 8, 16)) for i, ep in enumerate(eps)}
    loads = {ep: InFlightLoad(1, 1000 * i) for i, ep in enumerate(eps)}
    backlog = {ep.metadata.name: 10 * i for i, ep in enumerate(eps[::2])}
    plan = native().Plan(
        [
            (kernel.PREFIX, 0, 4.0, 0.0),
            (kernel.CACHED, 0, 1.0, 0.0),
            (kernel.TOKEN, 0, 2.0, 6000.0),
            (kernel.PREFILL, 0, 2.0, 0.0),
        ]
    )
    cached = [[0.5] * 20]
    for _ in range(count):
        plan.totals(eps, None, cached, infos, loads, infos, backlog, 90)
        plan.totals(eps[:3], [0.1, 0.2, 0.3], cached, infos, loads, infos, {}, 90)
        plan.totals(eps, None, cached, infos, loads, infos, {eps[1].metadata.name: HUGE}, 90)  # None
        with contextlib.suppress(AttributeError):
            plan.totals(eps, None, cached, {eps[3]: object()}, loads, infos, backlog, 90)


def test_a_hundred_thousand_calls_leak_nothing() -> None:
    _calls(200)
    gc.collect()
    refs = sys.getrefcount(HUGE)
    grown = traced_growth(_calls, settle=1000, measured=25_000)  # ~100k calls
    assert grown < TOLERANCE, f"traced memory grew by {grown} bytes"
    assert sys.getrefcount(HUGE) == refs


def test_arguments_keep_their_reference_counts() -> None:
    eps = [endpoint(i) for i in range(4)]
    shared = PrefixMatchInfo(0, 8, 16)
    infos = {eps[0]: shared, eps[1]: shared, eps[2]: PrefixMatchInfo(3, 8, 16)}
    loads = {eps[0]: InFlightLoad(1, 50)}
    backlog = {eps[0].metadata.name: 7}
    cached = [[0.5, 0.25, 0.0, 1.0]]
    partial = [0.1, 0.2, 0.3, 0.4]
    plan = native().Plan(
        [(kernel.PREFIX, 0, 4.0, 0.0), (kernel.TOKEN, 0, 2.0, 60.0), (kernel.PREFILL, 0, 1.0, 0.0)]
    )
    watched = (eps, *eps, shared, infos, loads, backlog, cached, *cached, partial, *partial, *infos.values())
    counts = [sys.getrefcount(o) for o in watched]
    for _ in range(1000):
        plan.totals(eps, partial, cached, infos, loads, infos, backlog, 90)
        plan.totals(tuple(eps), None, cached, infos, loads, infos, backlog, 90)
    assert [sys.getrefcount(o) for o in watched] == counts


# --- the Python path, chosen by the environment ------------------------------------------------


def test_epp_pure_python_selects_the_python_path() -> None:
    config = Path(__file__).parents[2] / "bench/configs/prefix-heavy.yaml"
    code = (
        "from epp.app.build import build; from epp.app.registry import default_registry; "
        "from epp.config.load import load_config; from epp.scheduling import kernel; "
        f"c = build(load_config(open({str(config)!r}).read()), default_registry()); "
        "print('RESULT', kernel.IMPLEMENTATION, c.scheduler.fused.implementation, kernel.NATIVE is not None, "
        "kernel.REASON)"
    )

    def result(value: str) -> list[str]:
        words = printed_with(code, kernel.PURE_PYTHON_ENV, value)  # the build logs its plugins first
        return words[len(words) - words[::-1].index("RESULT") :]

    assert result("1") == [
        "python",
        "python",
        "True",
        *f"{kernel.PURE_PYTHON_ENV} is set".split(),
    ]
    assert result("0")[:3] == ["c", "c", "True"]


def test_nan_scores_and_partials_keep_their_bits() -> None:
    eps = [endpoint(0), endpoint(1)]
    plan = native().Plan([(kernel.CACHED, 0, 2.0, 0.0)])
    got = plan.totals(eps, [math.nan, -0.0], [[0.5, -0.0]], {}, {}, {}, {}, 0)
    assert got is not None
    assert bits(got) == bits([math.nan + 0.5 * 2.0, -0.0 + -0.0 * 2.0])


class Info:
    """A slots class like PrefixMatchInfo, to change under the kernel (its slot reads are cached)."""

    __slots__ = ("block_size_tokens", "match_blocks", "total_blocks")

    def __init__(self, match: int, total: int, size: int) -> None:
        self.match_blocks, self.total_blocks, self.block_size_tokens = match, total, size


def test_a_class_changed_under_the_kernel_is_read_as_python_reads_it() -> None:
    """Slot reads are cached per type and version tag: a class changed after the kernel read it
    (a slot replaced by a property, a ``__getattr__`` added, a subclass) is read anew."""
    eps = [endpoint(0), endpoint(1)]
    infos: dict[Hashable, Any] = {eps[0]: Info(1, 4, 16), eps[1]: Info(2, 4, 16)}
    plan = native().Plan([(kernel.PREFIX, 0, 1.0, 0.0), (kernel.PREFILL, 0, 1.0, 0.0)])

    def python() -> list[float]:
        case = Case(eps, CycleState(), request(), [], None, [], {})
        case.state.set_attributes(PREFIX_MATCH, infos)
        case.req.prompt_token_count = 64
        case.ops = [(kernel.PREFIX, 0, 1.0, 0.0), (kernel.PREFILL, 0, 1.0, 0.0)]
        return case.python()

    def c() -> list[float] | None:
        totals: list[float] | None = plan.totals(eps, None, [], infos, {}, infos, {}, 64)
        return totals

    assert c() == python() == [0.25 + 0.0, 0.5 + 1.0]  # prefix, then prefill: 48 and 32 uncached
    slot = Info.__dict__["match_blocks"]
    try:
        setattr(Info, "match_blocks", property(lambda self: 3))  # noqa: B010 - mypy: a slot's name
        assert c() == python() == [0.75 + 1.0, 0.75 + 1.0]  # all equal estimates
    finally:
        setattr(Info, "match_blocks", slot)  # noqa: B010
    assert c() == python() == [0.25 + 0.0, 0.5 + 1.0]

    class Sub(Info):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return 8 if name == "total_blocks" else super().__getattribute__(name)

    infos[eps[1]] = Sub(2, 4, 16)
    assert c() == python() == [0.25 + 0.0, 0.25 + 1.0]
    del infos[eps[1]].match_blocks
    with pytest.raises(AttributeError):
        c()
    with pytest.raises(AttributeError):
        python()
