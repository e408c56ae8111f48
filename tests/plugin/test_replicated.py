"""The shared check of routed-prefix deltas (epp.plugin.replicated.parse_routed)."""

from __future__ import annotations

import pytest

from epp.plugin.replicated import parse_routed


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
