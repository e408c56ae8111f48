"""Per-key counts that plugins keep (in-flight tokens, queued blocks, bound sessions): a key
whose count reaches zero is dropped, so the map holds only what is outstanding and stays
bounded by it."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")


def subtract(counts: dict[K, int], key: K, amount: int) -> None:
    """Take ``amount`` off ``key``'s count; the key goes once nothing of it is left."""
    left = counts.get(key, 0) - amount
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
