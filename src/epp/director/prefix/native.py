"""The prefix stage's loops, in C when the extension was built, else in Python: a fenced leaf.

Per request the approximate prefix producer keeps the chat messages' role and content, hashes
~14 blocks of their JSON (an xxHash64 chain), walks them in the reverse index, and its hook
inserts or touches them in the picked server's LRU. In Python those loops cost ~40k instructions
a request (docs/decisions.md, "Fifth pass"), almost all of it Python's cost per step;
``_native.c`` runs the same loops in C over the *same* Python containers (the reverse index and
intern ``dict``s, the per-server ``OrderedDict``s, the request's message dicts), so the index's
data, its semantics and every other user of it stay as they are.

This module is a leaf (it imports nothing of the EPP; ``_native.c`` includes nothing of it).
References: the ``xxhash`` package for the hash values (``XXH64`` is our own code, from the
public specification) and the pure-Python functions below, kept as the fallback, for match, add,
evict and the kept messages; tests/director/prefix/test_native.py compares them on hypothesis input.

The extension is compiled by ``hatch_build.py`` at install (``pip install -e .`` or a wheel)
with the machine's C compiler; when that failed, or ``EPP_PURE_PYTHON=1`` is set, the Python
functions are used. ``ACTIVE`` is the implementation in use, ``IMPLEMENTATION`` its name ("c"
or "python"), ``REASON`` why Python; ``NATIVE`` (None only when not built) and ``PYTHON`` are both.
The hash values must not depend on which: peers exchange them and mixed versions coexist.
"""

from __future__ import annotations

import functools
import importlib
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final, NamedTuple

from xxhash import xxh64_intdigest

PURE_PYTHON_ENV: Final = "EPP_PURE_PYTHON"
BytesLike = bytes | bytearray | memoryview


def py_chain_hashes(data: BytesLike, block_bytes: int, max_blocks: int, seed: int) -> list[int]:
    """``h_i = xxh64(block_i, seed=h_{i-1})`` with ``h_{-1} = seed`` (see ``hashing.chain_hashes``)."""
    n = len(data)
    if block_bytes <= 0 or n < block_bytes or max_blocks <= 0:
        return []
    n = min(n, block_bytes * max_blocks)
    end = n - n % block_bytes
    out: list[int] = []
    append = out.append
    h = xxh64_intdigest
    prev = seed
    # The blocks cut by struct in C: a slice per block in the loop cost ~500 instructions more
    # a block than the hash itself (callgrind, 14 blocks: 27.7k -> 21.1k).
    for (block,) in _blocks(block_bytes).iter_unpack(data if end == len(data) else data[:end]):
        prev = h(block, prev)
        append(prev)
    if end < n:
        append(h(data[end:n], prev))
    return out


@functools.lru_cache(maxsize=64)
def _blocks(block_bytes: int) -> struct.Struct:
    """The struct that cuts ``block_bytes``-byte blocks (a few block sizes per deployment)."""
    return struct.Struct(f"{block_bytes}s")


def py_match(index: dict[int, int], hashes: Sequence[int]) -> dict[int, int]:
    """Slot → number of blocks held, walking ``hashes`` until the first block nobody holds.

    Holder sets are few and come in runs (one, usually, for a whole prompt), so each distinct mask
    is counted by ``list.count``: C loops, no Counter and no context manager per request.
    """
    masks: list[int] = list(map(index.get, hashes))  # type: ignore[arg-type]  # None cut next
    if None in masks:
        del masks[masks.index(None) :]  # type: ignore[arg-type]
    if not masks:
        return {}
    first = masks[0]
    n = len(masks)
    if masks.count(first) == n:  # one holder set for the whole walk
        if not first & (first - 1):  # ... of one server, the usual case
            return {first.bit_length() - 1: n}
        return dict.fromkeys(bits(first), n)
    counts: dict[int, int] = {}
    for mask in set(masks):
        k = masks.count(mask)
        for slot in bits(mask):
            counts[slot] = counts.get(slot, 0) + k
    return counts


def py_add(
    index: dict[int, int],
    intern: dict[int, int],
    lru: OrderedDict[int, None],
    hashes: Sequence[int],
    bit: int,
    capacity: int,
) -> int:
    """Insert ``hashes`` (most recent last) into the LRU of the server with ``bit``, held ones
    moved to the recent end, then evict down to ``capacity``; returns the change in ``len(lru)``."""
    touch = lru.move_to_end
    before = len(lru)
    for h in hashes:
        if h in lru:
            touch(h)
            continue
        lru[h] = None
        mask = index.get(h, 0) | bit
        index[h] = intern.setdefault(mask, mask)
    if len(lru) > capacity:
        py_evict(index, intern, lru, bit, len(lru) - capacity)
    return len(lru) - before


def py_evict(
    index: dict[int, int], intern: dict[int, int], lru: OrderedDict[int, None], bit: int, count: int
) -> None:
    """Drop the ``count`` least recently used hashes of the server with ``bit``."""
    clear = ~bit
    pop = lru.popitem
    for _ in range(count):
        h, _none = pop(last=False)
        mask = index[h] & clear
        if mask:
            index[h] = intern.setdefault(mask, mask)
        else:
            del index[h]


def py_kept_messages(messages: Any, system: Any) -> list[dict[str, Any]]:
    """The chat messages as a model server's prefix cache sees them (``hashing.user_input_bytes``):
    ``system`` first as a system message when not None, then each dict message keeping only
    ``role`` (when true) and ``content`` (None when absent); anything else is skipped."""
    kept: list[dict[str, Any]] = []
    if system is not None:
        kept.append({"role": "system", "content": system})
    if isinstance(messages, list):
        for m in messages:
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            kept.append(
                {"role": role, "content": m.get("content")} if role else {"content": m.get("content")}
            )
    return kept


def bits(mask: int) -> list[int]:
    """The slots whose bits are set in ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _load() -> tuple[ModuleType | None, str]:
    """The compiled module, or None and why not."""
    try:
        # by name, not ``from . import``: the extension is part of this leaf, not an EPP module
        return importlib.import_module(f"{__package__}._native"), ""
    except ImportError as e:
        return None, f"the C extension is not built ({e}); reinstall with a C compiler: pip install -e ."


class Loops(NamedTuple):
    """One implementation of the loops (``PYTHON``, ``NATIVE``); ``PrefixIndex`` takes one."""

    name: str  # "c" or "python"
    chain_hashes: Callable[[BytesLike, int, int, int], list[int]]
    match: Callable[[dict[int, int], Sequence[int]], dict[int, int]]
    add: Callable[[dict[int, int], dict[int, int], OrderedDict[int, None], Sequence[int], int, int], int]
    evict: Callable[[dict[int, int], dict[int, int], OrderedDict[int, None], int, int], None]
    kept_messages: Callable[[Any, Any], list[dict[str, Any]]]


PYTHON: Final = Loops("python", py_chain_hashes, py_match, py_add, py_evict, py_kept_messages)
_c, _why = _load()
NATIVE: Final = (
    None if _c is None else Loops("c", _c.chain_hashes, _c.match, _c.add, _c.evict, _c.kept_messages)
)
_forced = os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")
ACTIVE: Final = PYTHON if NATIVE is None or _forced else NATIVE
BUILT_FROM: Final[str | None] = getattr(_c, "SOURCE_SHA256", None)  # the SHA-256 of the _native.c compiled
REASON: Final = f"{PURE_PYTHON_ENV} is set" if _forced else _why
IMPLEMENTATION: Final = ACTIVE.name
chain_hashes: Final = ACTIVE.chain_hashes
kept_messages: Final = ACTIVE.kept_messages
