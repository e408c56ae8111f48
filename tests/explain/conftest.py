"""``epp explain`` configures logging for a one-shot command; put the suite's logging back after."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from epp import log as epp_log


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    min_level = epp_log._state.min_level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)
    epp_log._state.min_level = min_level
