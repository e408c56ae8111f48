"""vLLM's prefix-cache block hashes, computed for a request exactly as the engine will.

vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``: a block's digest is
``hash_fn((parent_digest, tuple(token_ids), extra_keys))``; the first block's parent is
NONE_HASH = ``hash_fn(PYTHONHASHSEED)`` (random when the engine has no seed: then nobody outside
the engine can reproduce its hashes).  ``hash_fn`` is ``--prefix-caching-hash-algo``
(vllm/utils/hashing.py): pickle, canonical CBOR or msgpack serialisation, then SHA-256 or
xxh3-128.  KV events name a block by the low 64 bits of its digest (the last 8 bytes read
big-endian, ``maybe_convert_block_hash``) or by the whole digest; ``external_hash`` folds both
to that 64-bit int, the index's key.
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

import cbor2
import msgspec
import xxhash

HASH_ALGOS: Final = ("sha256", "sha256_cbor", "sha256_msgpack", "xxhash", "xxhash_cbor", "xxhash_msgpack")
_MASK64: Final = (1 << 64) - 1
MEMO_ENTRIES: Final = 131_072  # memoised block digests kept (~19 MB, and ~8 MB of runs beside them)
CHUNK_BLOCKS: Final = 16  # blocks memoised together as one run (one lookup per run when seen before)
_MSGPACK: Final = msgspec.msgpack.Encoder()
V = TypeVar("V")


def _pickle(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    return bytes(cbor2.dumps(value, canonical=True))


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's ``get_hash_fn_by_name``."""
    kind, _, codec = algo.partition("_")
    serialise: Callable[[Any], bytes] | None = {"": _pickle, "cbor": _cbor, "msgpack": _MSGPACK.encode}.get(
        codec
    )
    if serialise is None or kind not in ("sha256", "xxhash"):
        raise ValueError(
            f"unsupported prefix caching hash algorithm {algo!r}; known: {', '.join(HASH_ALGOS)}"
        )
    encode = serialise
    if kind == "sha256":
        return lambda value: hashlib.sha256(encode(value)).digest()
    return lambda value: xxhash.xxh3_128_digest(encode(value))


def external_hash(value: int | bytes) -> int:
    """A block hash as KV events carry it (int or digest bytes) → the index's 64-bit key."""
    if isinstance(value, bytes):
        return int.from_bytes(value[-8:], "big")
    return value & _MASK64


class _Generations(Generic[V]):
    """A bounded memo in two generations of at most ``size`` entries each.  Entries are added to
    the young one; when it is full it becomes the old one and the previous old one is dropped; an
    entry found in the old generation moves to the young one.  So an entry in use survives any
    number of one-off ones (clearing the whole memo when full lost the hot with the cold)."""

    __slots__ = ("_old", "_young", "size")

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._young: dict[bytes, V] = {}
        self._old: dict[bytes, V] = {}

    def get(self, key: bytes) -> V | None:
        value = self._young.get(key)
        if value is None:
            value = self._old.pop(key, None)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: bytes, value: V) -> None:
        young = self._young
        young[key] = value
        if len(young) >= self.size:
            self._old = young
            self._young = {}

    def clear(self) -> None:
        self._young = {}
        self._old = {}


class BlockHasher:
    """The engine's block hashing: algorithm, block size and NONE_HASH from the seed.

    ``seed`` is the engine's PYTHONHASHSEED (llm-d's ``hashSeed``); without one the engine's
    hashes are random per process and only the events can be trusted, so ``seed=None`` is
    refused here.
    """

    __slots__ = ("_blocks", "_fn", "_msgpack", "_runs", "algo", "block_size", "none_hash")

    def __init__(self, algo: str, block_size: int, seed: str, memo_entries: int = MEMO_ENTRIES) -> None:
        if block_size <= 0:
            raise ValueError(f"block size must be > 0, got {block_size}")
        self.algo = algo
        self.block_size = block_size
        self._fn = hash_function(algo)
        self._msgpack = algo.endswith("_msgpack")
        self.none_hash = self._fn(seed)
        # block key -> digest, ``memo_entries`` in all
        self._blocks: _Generations[bytes] = _Generations(memo_entries // 2)
        # Runs of CHUNK_BLOCKS blocks: run key -> (their 64-bit keys, the last block's digest and
        # block key, to carry both chains on).  A prompt seen before costs one lookup per run
        # instead of one per block; a prefix shared only part of the way into a run falls back to
        # the block memo there.
        self._runs: _Generations[tuple[tuple[int, ...], bytes, bytes]] = _Generations(
            memo_entries // CHUNK_BLOCKS // 2
        )

    def digest(self, parent: bytes | None, tokens: Sequence[int], extra: tuple[Any, ...] | None) -> bytes:
        """One full block's digest, chained on ``parent`` (None: the first block)."""
        ids: Any = (tokens if isinstance(tokens, list) else list(tokens)) if self._msgpack else tuple(tokens)
        return self._fn((parent or self.none_hash, ids, extra))

    def hashes(
        self,
        tokens: Sequence[int],
        max_blocks: int = 0,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> list[int]:
        """The 64-bit keys of the request's full blocks, at most ``max_blocks`` (0: all).

        Extra keys as vLLM's ``generate_block_hash_extra_keys``: ``lora_name`` on every block of
        an adapter request, then ``cache_salt`` on the first block only; None when neither.

        Shared prefixes are the point of prefix routing, so digests are memoised: each block is
        looked up by an xxh3-128 chain over its token ids and everything before it (and the extra
        keys), which costs a fraction of serialising and SHA-hashing it again; whole runs of
        ``CHUNK_BLOCKS`` blocks are looked up the same way first, one lookup per run.
        """
        bs = self.block_size
        n = len(tokens) // bs
        if max_blocks > 0:
            n = min(n, max_blocks)
        if n == 0:
            return []
        extra = (lora_name,) if lora_name else None
        first = (*(extra or ()), cache_salt) if cache_salt else extra
        try:
            data = array("I", tokens[: n * bs]).tobytes()
        except (OverflowError, TypeError):
            return self._compute(tokens, n, extra, first)
        blocks, runs = self._blocks, self._runs
        fn = self._fn
        msgpack = self._msgpack
        width = bs * 4
        span = CHUNK_BLOCKS * width
        key = xxhash.xxh3_128_digest(repr((lora_name, cache_salt)).encode())
        chunk_key = key
        parent = self.none_hash
        out: list[int] = []
        i = 0
        while i < n:
            whole = i + CHUNK_BLOCKS <= n
            if whole:
                # a run of CHUNK_BLOCKS blocks seen before, as one lookup (its own key chain)
                chunk_key = xxhash.xxh3_128_digest(chunk_key + data[i * width : i * width + span])
                hit = runs.get(chunk_key)
                if hit is not None:
                    ints, parent, key = hit
                    out.extend(ints)
                    i += CHUNK_BLOCKS
                    continue
            stop = i + CHUNK_BLOCKS if whole else n
            for j in range(i, stop):
                key = xxhash.xxh3_128_digest(key + data[j * width : (j + 1) * width])
                digest = blocks.get(key)
                if digest is None:
                    chunk = tokens[j * bs : (j + 1) * bs]
                    ids: Any = (
                        (chunk if isinstance(chunk, list) else list(chunk)) if msgpack else tuple(chunk)
                    )
                    digest = fn((parent, ids, first if j == 0 else extra))
                    blocks.put(key, digest)
                parent = digest
                out.append(int.from_bytes(digest[-8:], "big"))
            if whole:
                runs.put(chunk_key, (tuple(out[i:stop]), parent, key))
            i = stop
        return out

    def _compute(
        self, tokens: Sequence[int], n: int, extra: tuple[Any, ...] | None, first: tuple[Any, ...] | None
    ) -> list[int]:
        bs = self.block_size
        parent = self.none_hash
        out = []
        for i in range(n):
            parent = self.digest(parent, tokens[i * bs : (i + 1) * bs], first if i == 0 else extra)
            out.append(int.from_bytes(parent[-8:], "big"))
        return out
