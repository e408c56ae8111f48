"""The prefix chain: each block's hash seeded by the one before, as the docstring defines it."""

from __future__ import annotations

import pytest
from xxhash import xxh64_intdigest

from epp.director.prefix.hashing import chain_hashes


def reference(data: bytes, block_bytes: int, max_blocks: int, seed: int) -> list[int]:
    """``chain_hashes`` as its docstring states it, one slice per block."""
    if block_bytes <= 0 or len(data) < block_bytes or max_blocks <= 0:
        return []
    data = data[: block_bytes * max_blocks]
    out: list[int] = []
    prev = seed
    for i in range(0, len(data), block_bytes):
        prev = xxh64_intdigest(data[i : i + block_bytes], prev)
        out.append(prev)
    return out


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 127, 128, 900, 1024, 5000])
@pytest.mark.parametrize(
    ("block_bytes", "max_blocks"), [(64, 256), (64, 3), (16, 1), (4, 1000), (0, 5), (64, 0)]
)
def test_the_chain_is_the_per_block_definition(size: int, block_bytes: int, max_blocks: int) -> None:
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    assert chain_hashes(data, block_bytes, max_blocks, 12345) == reference(
        data, block_bytes, max_blocks, 12345
    )


def test_a_block_size_never_seen_before_is_cut_too() -> None:
    """Block sizes come from engines (auto-tune): each new one gets its own cut."""
    data = b"x" * 1000 + b"y" * 77
    for block_bytes in range(1, 200, 7):
        assert chain_hashes(data, block_bytes, 10_000, 1) == reference(data, block_bytes, 10_000, 1)
