"""The prefix loops in C (``_native.c``) against their references: the ``xxhash`` package for the
chain's values, the pure-Python loops for the index (state compared exactly after each step).

Also: this machine built the extension (CI runs on the same kind: the C path is the one tested,
never a silent fallback), the build is of the current source, wrong types raise TypeError (never
a crash), 100k calls leak neither memory nor references, and EPP_PURE_PYTHON=1 selects Python.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh64_intdigest

from epp.director.prefix import native
from epp.director.prefix.index import PrefixIndex
from epp.director.prefix.native import NATIVE, PYTHON, Loops
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.testing.plugins import build
from tests.native_ext import TOLERANCE, printed_with, traced_growth

SOURCE = Path(native.__file__).with_name("_native.c")
U64 = 2**64 - 1


def c_loops() -> Loops:
    assert NATIVE is not None, f"the C extension is not in use on this machine: {native.REASON}"
    return NATIVE


def test_the_extension_is_built_here_and_is_the_current_source() -> None:
    """A failed build falls back silently at install (a warning pip hides): this test does not."""
    assert NATIVE is not None, native.REASON
    if os.environ.get(native.PURE_PYTHON_ENV, "") in ("", "0"):
        assert native.IMPLEMENTATION == "c"
        assert PrefixIndex().implementation == "c"
    assert hashlib.sha256(SOURCE.read_bytes()).hexdigest() == native.BUILT_FROM, (
        "the compiled _native is older than _native.c: rebuild it (pip install -e .)"
    )


def reference_chain(data: bytes, block_bytes: int, max_blocks: int, seed: int) -> list[int]:
    """The chain as defined: one slice per block, each hashed by xxhash seeded with the last."""
    if block_bytes <= 0 or len(data) < block_bytes or max_blocks <= 0:
        return []
    data = data[: block_bytes * max_blocks]
    out: list[int] = []
    prev = seed & U64  # xxhash takes the seed mod 2**64
    for i in range(0, len(data), block_bytes):
        prev = xxh64_intdigest(data[i : i + block_bytes], prev)
        out.append(prev)
    return out


SEEDS = st.sampled_from([0, 1, U64, 2**63]) | st.integers(0, U64)
BLOCKS = st.integers(-3, 80) | st.sampled_from([0, 1, 7, 8, 31, 32, 33, 64])


@given(data=st.binary(max_size=700), block_bytes=BLOCKS, max_blocks=st.integers(-2, 40), seed=SEEDS)
def test_chain_equals_xxhash_per_block(data: bytes, block_bytes: int, max_blocks: int, seed: int) -> None:
    expected = reference_chain(data, block_bytes, max_blocks, seed)
    assert c_loops().chain_hashes(data, block_bytes, max_blocks, seed) == expected
    assert PYTHON.chain_hashes(data, block_bytes, max_blocks, seed) == expected


@pytest.mark.parametrize("length", range(0, 100))
def test_one_block_of_every_length_is_xxh64(length: int) -> None:
    """Every tail path of XXH64 (32-byte stripes, 8-, 4- and 1-byte lanes) for a whole block."""
    data = bytes((i * 131 + 7) % 256 for i in range(length))
    for seed in (0, 1, 0x9E3779B185EBCA87, U64):
        got = c_loops().chain_hashes(data, max(length, 1), 1, seed)
        assert got == ([xxh64_intdigest(data, seed)] if length else [])


@given(
    data=st.binary(min_size=1, max_size=64),
    block_bytes=st.sampled_from([1, 2**62, 2**63 - 1, 2**63, 2**80, -(2**80)]),
    max_blocks=st.sampled_from([1, 2**62, 2**63, 2**80, -(2**80)]),
    seed=st.sampled_from([-1, -(2**70), 2**64, 2**64 + 5, 2**100]),
)
def test_out_of_range_sizes_and_seeds_as_python(
    data: bytes, block_bytes: int, max_blocks: int, seed: int
) -> None:
    """Sizes past a machine word saturate (they only bound lengths); the seed is taken mod 2**64."""
    expected = PYTHON.chain_hashes(data, block_bytes, max_blocks, seed)
    assert c_loops().chain_hashes(data, block_bytes, max_blocks, seed) == expected


def test_chain_takes_any_bytes_like_object() -> None:
    data = b"0123456789" * 20
    expected = PYTHON.chain_hashes(data, 16, 100, 5)
    assert c_loops().chain_hashes(bytearray(data), 16, 100, 5) == expected
    assert c_loops().chain_hashes(memoryview(data), 16, 100, 5) == expected


# --- the kept chat messages: the same dicts, so the same JSON and the same hashes ----------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
MESSAGE = st.dictionaries(
    st.sampled_from(["role", "content", "name", "tool_calls", "x"]),
    st.sampled_from(["", "user", "system", None, 0]) | JSON,
    max_size=4,
)
MESSAGES = st.one_of(st.lists(MESSAGE | JSON, max_size=5), JSON)


class GetCounting(dict[str, Any]):
    """A dict subclass whose ``get`` is its own: both implementations must call it."""

    def get(self, key: str, default: Any = None) -> Any:
        return f"{key}!" if key in self else default


@given(messages=MESSAGES, system=st.none() | JSON)
def test_kept_messages_equal_python(messages: Any, system: Any) -> None:
    c, py = c_loops().kept_messages(messages, system), PYTHON.kept_messages(messages, system)
    assert [list(d.items()) for d in c] == [list(d.items()) for d in py]  # key order too
    assert orjson.dumps(c) == orjson.dumps(py)


def test_kept_messages_of_a_dict_subclass_use_its_get() -> None:
    messages = [GetCounting(role="user", content="hi"), GetCounting(content="x")]
    assert c_loops().kept_messages(messages, None) == PYTHON.kept_messages(messages, None)
    assert c_loops().kept_messages(messages, None)[0] == {"role": "role!", "content": "content!"}


def test_kept_messages_pass_on_an_error_of_a_role_s_truth() -> None:
    class Bad:
        def __bool__(self) -> bool:
            raise RuntimeError("no truth")

    for loops in (c_loops(), PYTHON):
        with pytest.raises(RuntimeError, match="no truth"):
            loops.kept_messages([{"role": Bad()}], None)


# --- the index: C and Python side by side over random operation sequences ---------------------

HASHES = st.lists(st.integers(0, 40) | st.sampled_from([U64, 2**63, 12345678901234]), max_size=24)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 69), HASHES, st.integers(1, 30)),
        st.tuples(st.just("remove"), st.integers(0, 69), st.just([]), st.just(0)),
        st.tuples(st.just("match"), st.just(0), HASHES, st.just(0)),
        st.tuples(st.just("tuple-add"), st.integers(0, 3), HASHES, st.integers(1, 30)),
    ),
    max_size=60,
)


def state(index: PrefixIndex) -> tuple[Any, ...]:
    """Everything the index holds, LRU orders included (``dict ==`` ignores order: lists do not)."""
    lrus = [None if lru is None else list(lru.items()) for lru in index._lrus]
    return (
        list(index._index.items()),
        index._intern,
        lrus,
        index._entries,
        index._slot_of,
        index._names,
        index._free,
    )


def run_ops(ops: list[tuple[str, int, list[int], int]]) -> None:
    c, py = PrefixIndex(c_loops()), PrefixIndex(PYTHON)
    assert (c.implementation, py.implementation) == ("c", "python")
    for op, server, hashes, capacity in ops:
        name = f"s{server}"
        if op == "match":
            assert c.match(hashes) == py.match(hashes)
            assert c.match(tuple(hashes)) == py.match(hashes)
        elif op == "remove":
            c.remove_server(name)
            py.remove_server(name)
        else:
            seq = tuple(hashes) if op == "tuple-add" else hashes
            c.add(name, None, seq, capacity)
            py.add(name, None, list(seq), capacity)
        assert state(c) == state(py)
        everything = [h for lru in c._lrus if lru for h in lru]
        assert c.match(everything) == py.match(everything)


@settings(max_examples=300)
@given(OPS)
def test_index_loops_equal_python_loops(ops: list[tuple[str, int, list[int], int]]) -> None:
    """Up to 70 servers: masks past 64 bits take the C code's slow path."""
    run_ops(ops)


@pytest.mark.fuzz
@settings(max_examples=20000, deadline=None)
@given(OPS)
def test_index_loops_equal_python_loops_long(ops: list[tuple[str, int, list[int], int]]) -> None:
    run_ops(ops)


def test_a_long_shared_prefix_counts_every_holder() -> None:
    """Runs of different holder sets along one walk (the general case of match)."""
    for loops in (c_loops(), PYTHON):
        index = PrefixIndex(loops)
        index.add("a", None, [1, 2, 3, 4], 100)
        index.add("b", None, [1, 2], 100)
        index.add("z", None, [9], 100)
        for i in range(66):
            index.add(f"x{i}", None, [3], 100)
        assert index.match([1, 2, 3, 4, 5, 1]) == {0: 4, 1: 2, **{3 + i: 1 for i in range(66)}}


# --- bad input: TypeError naming the argument, never a crash ------------------------------------


def bad_calls() -> list[tuple[Callable[..., Any], tuple[Any, ...], type[Exception], str]]:
    c = c_loops()
    lru: OrderedDict[int, None] = OrderedDict()
    return [
        (c.chain_hashes, ("text", 4, 4, 0), TypeError, "data"),
        (c.chain_hashes, (b"x", 4.0, 4, 0), TypeError, "block_bytes"),
        (c.chain_hashes, (b"x", 4, None, 0), TypeError, "max_blocks"),
        (c.chain_hashes, (b"x", 4, 4, "0"), TypeError, "seed"),
        (c.chain_hashes, (b"x", 4, 4), TypeError, "4 arguments"),
        (c.match, ([], [1]), TypeError, "index"),
        (c.match, ({}, 5), TypeError, "hashes"),
        (c.match, ({1: 2}, [1, "2"]), TypeError, "hashes[1]"),
        (c.match, ({1: 2}, [True]), TypeError, "hashes[0]"),
        (c.match, ({1: "2"}, [1]), TypeError, "masks"),
        (c.match, ({1: -2}, [1]), ValueError, "non-negative"),
        (c.add, ({}, {}, {}, [1], 1, 4), TypeError, "lru"),
        (c.add, ({}, [], lru, [1], 1, 4), TypeError, "intern"),
        (c.add, ({}, {}, lru, [1.5], 1, 4), TypeError, "hashes[0]"),
        (c.add, ({}, {}, lru, [1], "1", 4), TypeError, "bit"),
        (c.add, ({}, {}, lru, [1], 0, 4), ValueError, "bit"),
        (c.add, ({}, {}, lru, [1], 1, "4"), TypeError, "capacity"),
        (c.add, ({}, {}, lru, None, 1, 4), TypeError, "hashes"),
        (c.evict, ({}, {}, OrderedDict(), 1, 1), KeyError, "empty"),
        (c.evict, ({}, {}, lru, 1), TypeError, "5 arguments"),
        (c.kept_messages, ([],), TypeError, "2 arguments"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())))
def test_wrong_types_raise_a_clear_error(case: int) -> None:
    fn, args, exc, words = bad_calls()[case]
    with pytest.raises(exc, match=re.escape(words)):
        fn(*args)


def test_an_lru_subclass_is_refused() -> None:
    """Its move_to_end could be overridden: the C loops take exact containers only."""

    class Sub(OrderedDict[int, None]):
        pass

    with pytest.raises(TypeError, match=r"lru must be a collections\.OrderedDict"):
        c_loops().add({}, {}, Sub(), [1], 1, 4)


# --- no leaks ---------------------------------------------------------------------------------


def exercise(n: int) -> None:
    """``n`` rounds of every function, the error paths included, on a bounded index."""
    c = c_loops()
    data = bytes(range(256)) * 4
    big = 1 << 70  # a slot past the machine word
    messages = [{"role": "user", "content": "hi", "name": "x"}, {"content": ["a"]}, 3, GetCounting(role="r")]
    for i in range(n):
        index: dict[int, int] = {}
        intern: dict[int, int] = {}
        lru: OrderedDict[int, None] = OrderedDict()
        other: OrderedDict[int, None] = OrderedDict()
        hashes = c.chain_hashes(data, 64, 14, i)
        c.add(index, intern, lru, hashes, 1, 10)
        c.add(index, intern, other, hashes[:5], big, 10)
        c.add(index, intern, lru, hashes[-3:], 1, 10)  # held: moved to the end
        c.add(index, intern, lru, hashes[:3], 1, 10)  # evicted before: inserted, the oldest evicted
        c.match(index, hashes)
        c.evict(index, intern, other, big, 5)
        c.kept_messages(messages, "sys")
        for fn, args, exc, _words in bad_calls()[:6]:
            with contextlib.suppress(exc):
                fn(*args)


def test_a_hundred_thousand_calls_leak_nothing() -> None:
    exercise(200)  # warm: caches, interned objects, the bad_calls table's types
    gc.collect()
    probe_bit = 1 << 70
    refs = sys.getrefcount(probe_bit), sys.getrefcount(None)
    grown = traced_growth(exercise, settle=1000, measured=10_000)  # ~100k calls
    assert grown < TOLERANCE, f"traced memory grew by {grown} bytes"
    assert sys.getrefcount(probe_bit) == refs[0]
    assert abs(sys.getrefcount(None) - refs[1]) < 100  # None is shared with everything else


def test_arguments_keep_their_reference_counts() -> None:
    c = c_loops()
    index: dict[int, int] = {}
    intern: dict[int, int] = {}
    lru: OrderedDict[int, None] = OrderedDict()
    hashes = c.chain_hashes(b"y" * 1000, 64, 20, 3)
    bit = 1 << 80
    capacity = 10**6
    c.add(index, intern, lru, hashes, bit, capacity)
    role, content, system = "user-role", ["content"], {"s": 1}
    messages = [{"role": role, "content": content}, GetCounting(role=role), {"role": "", "content": content}]
    watched = (index, intern, lru, hashes, bit, capacity, None, role, content, system, messages, *messages)
    watched = (*watched, *hashes, *index.values())
    counts = [sys.getrefcount(o) for o in watched]
    for _ in range(1000):
        c.add(index, intern, lru, hashes, bit, capacity)
        c.match(index, hashes)
        c.kept_messages(messages, system)
    assert [sys.getrefcount(o) for o in watched] == counts


# --- the Python path, chosen by the environment ------------------------------------------------


def test_the_producer_shows_which_loops_run() -> None:
    """/debug/plugins/state: ``loops`` names the implementation (and why when it is Python)."""
    producer: ApproxPrefixCacheProducer = build(ApproxPrefixCacheProducer)
    expected: dict[str, Any] = {"implementation": native.IMPLEMENTATION}
    if native.IMPLEMENTATION == "python":
        expected["reason"] = native.REASON
    assert producer.debug_state()["loops"] == expected
    producer.index = PrefixIndex(PYTHON)
    assert producer.debug_state()["loops"] == {"implementation": "python", "reason": native.REASON}


def test_epp_pure_python_selects_the_python_loops() -> None:
    code = (
        "from epp.director.prefix import native; from epp.director.prefix.index import PrefixIndex; "
        "print(native.IMPLEMENTATION, PrefixIndex().implementation, native.NATIVE is not None, native.REASON)"
    )
    assert printed_with(code, native.PURE_PYTHON_ENV, "1") == [
        "python",
        "python",
        "True",
        *f"{native.PURE_PYTHON_ENV} is set".split(),
    ]
    assert printed_with(code, native.PURE_PYTHON_ENV, "0")[:3] == ["c", "c", "True"]
