"""PrefixIndex: LRU order, bounds and the reverse index kept exact under random churn."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from epp.director.prefix.index import PrefixIndex


def _check_against_model(index: PrefixIndex, model: dict[str, OrderedDict[int, None]]) -> None:
    """The index holds exactly the model's LRUs, and its reverse index exactly their union."""
    assert len(index) == sum(len(lru) for lru in model.values())
    holders: dict[int, set[str]] = {}
    for name, lru in model.items():
        assert index.server_size(name) == len(lru)
        for h in lru:
            holders.setdefault(h, set()).add(name)
    assert index.reverse_size == len(holders)
    for h, names in holders.items():
        assert index.holders(h) == names


@pytest.mark.parametrize(
    ("seed", "servers", "capacity"),
    [
        pytest.param(1, 3, 5, id="tiny-capacity"),
        pytest.param(2, 8, 40, id="several-servers"),
        pytest.param(3, 70, 12, id="more-servers-than-a-machine-word"),
    ],
)
def test_random_churn_matches_reference_lru(seed: int, servers: int, capacity: int) -> None:
    """Adds, touches, evictions and removals agree with a plain OrderedDict LRU model."""
    rng = random.Random(seed)
    index = PrefixIndex()
    model: dict[str, OrderedDict[int, None]] = {}
    universe = [rng.getrandbits(64) for _ in range(capacity * 4)]
    for step in range(600):
        name = f"s{rng.randrange(servers)}"
        if step % 97 == 96 and model:
            gone = rng.choice(sorted(model))
            index.remove_server(gone)
            del model[gone]
            continue
        hashes = [rng.choice(universe) for _ in range(rng.randrange(1, capacity + 3))]
        index.add(name, None, hashes, capacity)
        lru = model.setdefault(name, OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity:
            lru.popitem(last=False)
        query = [rng.choice(universe) for _ in range(rng.randrange(0, capacity + 3))]
        assert _named(index, index.match(query)) == _model_match(model, query)
    _check_against_model(index, model)


def _named(index: PrefixIndex, counts: dict[int, int]) -> dict[str, int]:
    return {index.name_of(slot): n for slot, n in counts.items()}


def _model_match(model: dict[str, OrderedDict[int, None]], query: list[int]) -> dict[str, int]:
    """GIE's walk, block by block: every holder counts a block, until one nobody holds."""
    out: dict[str, int] = {}
    for h in query:
        holders = [name for name, lru in model.items() if h in lru]
        if not holders:
            break
        for name in holders:
            out[name] = out.get(name, 0) + 1
    return out


def test_match_counts_every_holder_until_first_miss() -> None:
    """Each walked block counts for every server holding it; the walk stops at the first unheld block."""
    index = PrefixIndex()
    index.add("a", None, [1, 2, 3, 4], 100)
    index.add("b", None, [1, 3], 100)
    counts = index.match([1, 2, 3, 9, 4])
    assert {index.name_of(s): n for s, n in counts.items()} == {"a": 3, "b": 2}
    assert index.match([9, 1]) == {}
    assert index.match([]) == {}


def test_capacity_shrink_evicts_oldest() -> None:
    """A smaller capacity on a later add evicts the least recently used entries."""
    index = PrefixIndex()
    index.add("a", None, [1, 2, 3, 4], 10)
    index.add("a", None, [1], 2)
    assert index.server_size("a") == 2
    assert index.holders(1) == {"a"}
    assert index.holders(4) == {"a"}
    assert index.holders(2) == set()


def test_a_prompt_the_server_holds_moves_to_the_recent_end_and_a_smaller_capacity_still_evicts() -> None:
    """Re-adding held blocks (the usual request) touches them in order, as the insertion loop does."""
    index = PrefixIndex()
    index.add("a", None, [1, 2, 3], 10)
    index.add("a", None, [4, 5], 10)
    index.add("a", None, [2, 1], 10)  # all held: order now 3, 4, 5, 2, 1
    assert index.dump() == {"a": [3, 4, 5, 2, 1]}
    assert len(index) == 5
    index.add("a", None, [5, 2], 3)  # all held, capacity now 3: the least recent two go
    assert index.dump() == {"a": [1, 5, 2]}
    assert len(index) == 3
    assert index.holders(3) == set() and index.holders(4) == set()
    assert index.match([1, 5, 2]) == {0: 3}
