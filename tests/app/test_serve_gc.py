"""The EPP tunes the cyclic collector once it serves (epp.app.serve.tune_gc)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from epp.app.serve import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_startup_heap_is_frozen_and_gen0_collects_less_often() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    tune_gc()
    assert gc.get_freeze_count() > 1000  # modules, config and plugins leave the collector's scans
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # less often than CPython's default
