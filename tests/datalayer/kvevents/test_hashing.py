"""Request-side block hashes equal vLLM's for every --prefix-caching-hash-algo, seed and extra key."""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import cbor2
import msgspec
import pytest
import xxhash

from epp.datalayer.kvevents.hashing import HASH_ALGOS, BlockHasher, external_hash, hash_function
from epp_sim.hashing import BlockHasher as SimHasher


def reference_fn(algo: str) -> Any:
    """vllm/utils/hashing.py, written out: serialiser then digest."""

    def serialise(value: Any) -> bytes:
        if algo.endswith("_cbor"):
            return bytes(cbor2.dumps(value, canonical=True))
        if algo.endswith("_msgpack"):
            return msgspec.msgpack.encode(value)
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    if algo.startswith("sha256"):
        return lambda v: hashlib.sha256(serialise(v)).digest()
    return lambda v: xxhash.xxh3_128_digest(serialise(v))


def reference_hashes(
    tokens: list[int], bs: int, algo: str, seed: str, extra_all: tuple[Any, ...] | None, salt: str | None
) -> list[int]:
    """vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens, the request block hasher's
    extra keys (LoRA name on every block, cache_salt on the first) and maybe_convert_block_hash."""
    fn = reference_fn(algo)
    parent = fn(seed)
    out = []
    for i, start in enumerate(range(0, len(tokens) - bs + 1, bs)):
        keys = list(extra_all or ()) + ([salt] if salt and i == 0 else [])
        extra = tuple(keys) if keys else None
        block = tokens[start : start + bs]
        parent = fn((parent, block if algo.endswith("_msgpack") else tuple(block), extra))
        out.append(int.from_bytes(parent, byteorder="big") & ((1 << 64) - 1))
    return out


TOKENS = [(i * 7919) % 50_000 for i in range(100)]  # 6 full blocks of 16, 4 tokens left over


@pytest.mark.parametrize("algo", HASH_ALGOS)
@pytest.mark.parametrize(
    ("lora", "salt"), [(None, None), ("sql-adapter", None), (None, "tenant-a"), ("sql-adapter", "tenant-a")]
)
def test_hashes_equal_vllms(algo: str, lora: str | None, salt: str | None) -> None:
    hasher = BlockHasher(algo, 16, "42")
    got = hasher.hashes(TOKENS, 0, lora, salt)
    assert got == reference_hashes(TOKENS, 16, algo, "42", (lora,) if lora else None, salt)
    assert len(got) == 6


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_the_simulator_hashes_like_the_epp(algo: str) -> None:
    """The simulator's engine chain and the EPP's request chain agree, block by block."""
    sim = SimHasher(algo, "7")
    digest = None
    chain = []
    for start in range(0, 96, 16):
        digest = sim.block(digest, TOKENS[start : start + 16], None)
        chain.append(external_hash(digest))
    assert BlockHasher(algo, 16, "7").hashes(TOKENS) == chain


def test_seed_block_size_and_limit_change_the_hashes() -> None:
    base = BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS)
    assert BlockHasher("sha256_cbor", 16, "43").hashes(TOKENS)[0] != base[0]
    assert BlockHasher("sha256_cbor", 32, "42").hashes(TOKENS)[0] != base[0]
    assert BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS, 2) == base[:2]
    assert BlockHasher("sha256_cbor", 16, "42").hashes(TOKENS[:15]) == []


def test_external_hash_folds_digests_to_their_low_64_bits() -> None:
    digest = bytes(range(32))
    assert external_hash(digest) == int.from_bytes(digest, "big") & ((1 << 64) - 1)
    assert external_hash(2**70 + 5) == 5


def test_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported prefix caching hash algorithm"):
        hash_function("md5")
    with pytest.raises(ValueError, match="block size"):
        BlockHasher("sha256", 0, "")


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash_msgpack"])
def test_memoised_hashes_equal_fresh_ones(algo: str) -> None:
    """The memo is keyed by everything a block's digest depends on: shared prefixes, other suffixes,
    LoRA and salt variants and huge token ids all hash as a fresh hasher (and as vLLM) does."""
    warm = BlockHasher(algo, 16, "9")
    prompts = [TOKENS, TOKENS[:48] + [7] * 40, TOKENS[:47] + [8] * 41, [2**40 + t for t in TOKENS]]
    variants: list[tuple[str | None, str | None]] = [
        (None, None),
        ("lora", None),
        (None, "salt"),
        ("lora", "salt"),
    ]
    for _ in range(2):
        for tokens in prompts:
            for lora, salt in variants:
                got = warm.hashes(tokens, 0, lora, salt)
                assert got == BlockHasher(algo, 16, "9").hashes(tokens, 0, lora, salt)
                assert got == reference_hashes(tokens, 16, algo, "9", (lora,) if lora else None, salt)


def count_hashing(h: BlockHasher) -> list[int]:
    """Count the digests ``h`` computes (serialise and hash) from now on: [count]."""
    calls = [0]
    fn = h._fn

    def counting(value: object) -> bytes:
        calls[0] += 1
        return fn(value)

    h._fn = counting
    return calls


def test_a_prefix_in_use_stays_memoised_through_more_one_off_prompts_than_the_memo_holds() -> None:
    """A 24-block memo (12 per generation) and a 4-block shared prefix, used again after every 8 new
    blocks (two one-off prompts of 4 blocks: one behind the prefix, one alone) for 160 new blocks in
    all: the shared blocks are hashed once, every other block once, and every digest stays right
    as the generations turn over.  (Clearing the memo when full hashed the prefix again.)"""
    h = BlockHasher("sha256", 16, "9", memo_entries=24)
    calls = count_hashing(h)
    shared = TOKENS[:64]
    for i in range(20):
        one_off = [1_000_000 + 64 * i + t for t in range(64)]
        for tokens in (shared + one_off, one_off):
            assert h.hashes(tokens) == reference_hashes(tokens, 16, "sha256", "9", None, None)
    assert calls[0] == 4 + 20 * 8


LONG = [(i * 104_729) % 150_000 for i in range(16 * 50)]  # 50 blocks: three runs of 16 and 2 more


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash_msgpack"])
def test_runs_of_blocks_memoised_together_hash_as_fresh_ones(algo: str) -> None:
    """Long prompts sharing a prefix that ends inside a run (block 20), at a run's end (block 32) or
    not at all, with and without LoRA and salt, hashed twice by one hasher (and by one whose memo
    generations turn over all the time): the same keys as a fresh hasher and vLLM's formula (the run
    memo carries both key chains on)."""
    warm = BlockHasher(algo, 16, "9")
    tiny = BlockHasher(algo, 16, "9", memo_entries=32)  # generations turn over at every run
    prompts = [LONG, LONG[: 16 * 20] + [5] * 16 * 30, LONG[: 16 * 32] + [6] * 16 * 18, [7] * 16 * 40]
    for _ in range(2):
        for tokens in prompts:
            for lora, salt in ((None, None), ("lora", None), (None, "salt")):
                got = warm.hashes(tokens, 0, lora, salt)
                assert got == BlockHasher(algo, 16, "9").hashes(tokens, 0, lora, salt)
                assert got == reference_hashes(tokens, 16, algo, "9", (lora,) if lora else None, salt)
                assert tiny.hashes(tokens, 0, lora, salt) == got
    assert warm.hashes(LONG, 40) == reference_hashes(LONG, 16, algo, "9", None, None)[:40]


def test_a_prompt_seen_before_is_looked_up_by_runs_not_by_blocks() -> None:
    """A 40-block prefix of a 50-block prompt seen before computes nothing (two runs, then the block
    memo, reached on the right key chain after the runs); with the block memo emptied, the whole
    prompt computes only its last 2 blocks (outside a whole run of 16), the other 48 from runs."""
    h = BlockHasher("sha256", 16, "9")
    calls = count_hashing(h)
    first = h.hashes(LONG)
    assert calls[0] == 50
    # 40 blocks: two runs, then 8 blocks of the third looked up one by one on the block chain
    assert h.hashes(LONG[: 16 * 40]) == first[:40]
    assert calls[0] == 50
    h._blocks.clear()
    assert h.hashes(LONG) == first
    assert calls[0] == 52
