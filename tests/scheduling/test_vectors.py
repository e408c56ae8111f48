"""The scheduler gives, request by request, the outcomes recorded in scheduler_vectors.json.

A guard for refactoring: the picks, the picker's floats and every explained breakdown must stay
bit-identical to what the scheduler gave when the vectors were recorded (tests/scheduling/vectors.py
says what the scenarios exercise and how to re-record them after a change meant to route differently).
"""

from __future__ import annotations

import json

import pytest

from tests.scheduling.vectors import SCENARIOS, VECTORS, scenario

RECORDED: dict[str, list[str]] = json.loads(VECTORS.read_text())


def test_every_scenario_was_recorded() -> None:
    assert sorted(map(int, RECORDED)) == list(range(SCENARIOS))


@pytest.mark.parametrize("seed", range(SCENARIOS))
def test_outcomes_match_the_recording(seed: int) -> None:
    got = list(scenario(seed))
    want = RECORDED[str(seed)]
    first = next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w), None)
    assert first is None, f"scenario {seed}: request {first} differs from the recording"
