"""Shared fixtures for the whole suite."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which names the groups it finds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``fuzz`` tests (long hypothesis runs) run only when selected: ``pytest -m fuzz``.

    ``e2e`` and ``serial`` tests run last and, under ``make test``'s ``-n 2 --dist loadgroup``,
    as one xdist group: one worker runs them one after another once the other tests are done, so
    their real processes never share the two cores with another such test or a burst of unit
    tests, and their wall-clock bounds hold as they did serially."""
    items.sort(key=_serial)  # stable: collection order otherwise
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if _serial(item):
                item.add_marker(pytest.mark.xdist_group("serial"))
    if "fuzz" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="long hypothesis run: select it with -m fuzz")
    for item in items:
        if "fuzz" in item.keywords:
            item.add_marker(skip)


def _serial(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None or item.get_closest_marker("serial") is not None
