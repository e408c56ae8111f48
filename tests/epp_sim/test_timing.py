"""Tests of the step time model."""

from __future__ import annotations

import pytest

from epp_sim.config import EngineConfig
from epp_sim.timing import StepWork, TimeModel


@pytest.mark.parametrize(
    ("work", "expected_ms"),
    [
        pytest.param(StepWork(0, 1, 0, 0), 6.08, id="single-decode"),
        pytest.param(StepWork(2000, 0, 0, 0), 106.0, id="2k-token-prefill"),
        pytest.param(StepWork(0, 64, 64_000, 0), 6.0 + 5.12 + 2.56, id="batch-of-64-with-context"),
        pytest.param(StepWork(16, 0, 0, 2), 6.0 + 0.8 + 50.0, id="two-adapter-loads"),
    ],
)
def test_default_step_times(work: StepWork, expected_ms: float) -> None:
    """Defaults: 6 ms per step, 0.05 ms per prefill token, 0.08 ms per decode, 0.04 ms per 1k context."""
    assert TimeModel.from_config(EngineConfig()).step_ms(work) == pytest.approx(expected_ms)


def test_step_time_grows_with_batch_and_prefill() -> None:
    """More decoding sequences or more uncached prompt tokens make a step strictly longer."""
    model = TimeModel.from_config(EngineConfig())
    assert model.step_ms(StepWork(0, 2, 0, 0)) > model.step_ms(StepWork(0, 1, 0, 0))
    assert model.step_ms(StepWork(100, 1, 0, 0)) > model.step_ms(StepWork(10, 1, 0, 0))
