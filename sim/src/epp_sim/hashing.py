"""vLLM's prefix-cache block hashes (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py).

A block's hash is ``hash_fn((parent_digest, tuple(token_ids), extra_keys))`` where the first
block's parent is NONE_HASH = ``hash_fn(PYTHONHASHSEED)`` (random bytes when the seed is unset,
as vLLM does), ``extra_keys`` is ``None`` or a tuple (the LoRA name first), and ``hash_fn`` is
the ``--prefix-caching-hash-algo``: pickle, canonical CBOR or msgpack serialisation, then
SHA-256 or xxh3-128.  KV events carry a block as the low 64 bits of its digest
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, vLLM's default): the last 8 bytes, big-endian.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Final

import cbor2
import msgspec
import xxhash

HASH_ALGOS: Final = ("sha256", "sha256_cbor", "sha256_msgpack", "xxhash", "xxhash_cbor", "xxhash_msgpack")
_MSGPACK: Final = msgspec.msgpack.Encoder()


def _pickle(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's ``get_hash_fn_by_name``: serialiser then digest."""
    serialise: Callable[[Any], bytes]
    kind, _, codec = algo.partition("_")
    if codec == "":
        serialise = _pickle
    elif codec == "cbor":
        serialise = _cbor
    elif codec == "msgpack":
        serialise = _MSGPACK.encode
    else:
        raise ValueError(
            f"unsupported prefix caching hash algorithm {algo!r}; known: {', '.join(HASH_ALGOS)}"
        )
    if kind == "sha256":
        return lambda value: hashlib.sha256(serialise(value)).digest()
    if kind == "xxhash":
        return lambda value: xxhash.xxh3_128_digest(serialise(value))
    raise ValueError(f"unsupported prefix caching hash algorithm {algo!r}; known: {', '.join(HASH_ALGOS)}")


def external_hash(digest: bytes) -> int:
    """vLLM's ``maybe_convert_block_hash`` with int hashes on: the digest's low 64 bits."""
    return int.from_bytes(digest[-8:], "big")


class BlockHasher:
    """One engine's hasher: its algorithm and NONE_HASH (fixed at start, like vLLM's init_none_hash)."""

    __slots__ = ("_fn", "_msgpack", "algo", "none_hash")

    def __init__(self, algo: str = "sha256", seed: str | None = None) -> None:
        self.algo = algo
        self._fn = hash_function(algo)
        self._msgpack = algo.endswith("_msgpack")
        if seed is None:
            seed = os.environ.get("PYTHONHASHSEED")
        self.none_hash = os.urandom(32) if seed is None else self._fn(seed)

    def block(self, parent: bytes | None, tokens: Sequence[int], extra: tuple[Any, ...] | None) -> bytes:
        """``hash_block_tokens``: the digest of one full block chained on its parent's digest."""
        ids: Any = (tokens if isinstance(tokens, list) else list(tokens)) if self._msgpack else tuple(tokens)
        return self._fn((parent or self.none_hash, ids, extra))
