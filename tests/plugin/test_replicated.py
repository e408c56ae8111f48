"""The shared check of routed-prefix deltas (epp.plugin.replicated.parse_routed)."""

from __future__ import annotations

import pytest

from epp.plugin.replicated import merge_routed, parse_routed


def test_parse_routed_keeps_a_well_formed_batch() -> None:
    assert parse_routed([["e", [1, 2]], ("f", [])], "x") == [("e", [1, 2]), ("f", [])]


@pytest.mark.parametrize(
    "batch",
    [
        [["e", [1]], ["e", [-2]]],  # a negative hash
        [["e", [1 << 64]]],  # past uint64
        [["e", [1.0]]],  # not an int
        [["e"]],  # no hashes
        [[1, [1]]],  # no name
        [["e", (1,)]],  # hashes not a list
    ],
)
def test_parse_routed_names_the_bad_row(batch: list[object]) -> None:
    with pytest.raises(ValueError, match=r"x: expected \[endpoint name"):
        parse_routed(batch, "x")


def test_parse_routed_refuses_a_batch_that_is_not_a_list() -> None:
    with pytest.raises(ValueError, match="x: expected a list, got dict"):
        parse_routed({}, "x")


def test_merge_routed_keeps_each_hash_at_its_last_insertion_per_endpoint() -> None:
    batch = [["e", [1, 2, 3]], ["f", [9]], ["e", [1, 2, 4]], ["e", [3]]]
    copy = [[n, list(h)] for n, h in batch]
    assert merge_routed(batch) == [["e", [1, 2, 4, 3]], ["f", [9]]]
    assert batch == copy  # the drained lists (shared with requests) are not changed


def test_merge_routed_passes_a_single_insertion_through() -> None:
    batch = [["e", [1, 2]]]
    assert merge_routed(batch) is batch
    assert merge_routed([]) == []
