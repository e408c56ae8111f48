"""Shared fixtures for the whole suite, and ``make test``'s order and xdist schedule."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

import pytest

_SERIAL_FILE = pytest.StashKey[pathlib.Path]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``fuzz`` tests (long hypothesis runs) run only when selected: ``pytest -m fuzz``.

    ``e2e`` and ``serial`` tests run last, e2e first; under xdist (``make test``: ``-n 2``) one
    worker runs them one after another from the start while the other runs the unit tests
    (tests/serial_tail.py), which end well before them, so the ``serial`` ones at the end have
    the machine to themselves."""
    items.sort(key=_order)  # stable: collection order otherwise
    path = getattr(config, "workerinput", {}).get("epp_serial_nodeids")
    if path is not None:
        from tests.serial_tail import write_serial

        write_serial(pathlib.Path(path), [item.nodeid for item in items if _order(item)])
    if "fuzz" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="long hypothesis run: select it with -m fuzz")
    for item in items:
        if "fuzz" in item.keywords:
            item.add_marker(skip)


def _order(item: pytest.Item) -> int:
    """0: a unit test; 1: an e2e test; 2: a ``serial`` one (a wall-clock bound, not e2e)."""
    if item.get_closest_marker("e2e") is not None:
        return 1
    return 2 if item.get_closest_marker("serial") is not None else 0


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker where to write its serial tests' node ids."""
    config: pytest.Config = node.config
    if _SERIAL_FILE not in config.stash:
        from tests.serial_tail import serial_file

        config.stash[_SERIAL_FILE] = serial_file()
    node.workerinput["epp_serial_nodeids"] = str(config.stash[_SERIAL_FILE])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist controller, ``--dist load`` (``-n`` alone): the serial tests on one worker."""
    if config.getoption("dist") != "load" or _SERIAL_FILE not in config.stash:
        return None
    from tests.serial_tail import SerialTail

    return SerialTail(config, log, config.stash[_SERIAL_FILE])


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_SERIAL_FILE, None)
    if path is not None:
        shutil.rmtree(path.parent, ignore_errors=True)
