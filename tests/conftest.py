"""Shared fixtures for the whole suite."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``fuzz`` tests (long hypothesis runs) run only when selected: ``pytest -m fuzz``."""
    if "fuzz" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="long hypothesis run: select it with -m fuzz")
    for item in items:
        if "fuzz" in item.keywords:
            item.add_marker(skip)
