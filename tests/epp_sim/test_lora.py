"""Tests of LoRA bookkeeping: the served registry and the engine's GPU slots."""

from __future__ import annotations

import pytest

from epp_sim.lora import LoraRegistry, LoraSlots


def test_registry_ids_and_paths() -> None:
    """Adapters get vLLM-style ids 1, 2, ... in load order; a missing path gets a default."""
    registry = LoraRegistry(["a", "b=/models/b"])
    c = registry.load("c", "/c")
    a, b = registry.get("a"), registry.get("b")
    assert a is not None
    assert b is not None
    assert [(x.name, x.path, x.id) for x in (a, b, c)] == [
        ("a", "/adapters/a", 1),
        ("b", "/models/b", 2),
        ("c", "/c", 3),
    ]
    assert registry.unload("a")
    assert not registry.unload("a")
    assert [x.name for x in registry.adapters()] == ["b", "c"]


@pytest.mark.parametrize(
    ("max_loras", "rounds", "loads"),
    [
        pytest.param(2, [["a"], ["a", "b"], ["b"]], [1, 1, 0], id="resident-adapters-load-once"),
        pytest.param(1, [["a"], ["b"], ["a"]], [1, 1, 1], id="one-slot-swaps"),
        pytest.param(2, [["a"], ["b"], ["c"], ["b"]], [1, 1, 1, 0], id="lru-evicts-oldest"),
    ],
)
def test_slots_count_loads(max_loras: int, rounds: list[list[str]], loads: list[int]) -> None:
    """An adapter costs a load only when it is not resident; the least recently used one is evicted."""
    slots = LoraSlots(max_loras)
    assert [slots.ensure(needed) for needed in rounds] == loads


def test_slots_refuse_more_than_max() -> None:
    """Needing more adapters at once than slots is a scheduler bug, reported loudly."""
    with pytest.raises(RuntimeError, match="more than max_loras=1"):
        LoraSlots(1).ensure(["a", "b"])
