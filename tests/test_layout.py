"""Layout rule: plugin folders hold plugins; helpers move beside them (issue #14)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Helpers still inside a plugin folder, to be moved out by the folder's owners; do not add to this.
NOT_YET_MOVED: frozenset[str] = frozenset()


def plugin_folders() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("plugins see only")
    )
    folders = []
    for name in contract["source_modules"]:
        if hasattr(importlib.import_module(name), "__path__"):
            folders.append(name)
    return folders


def modules_in_plugin_folders() -> list[str]:
    found: list[str] = []
    for folder in plugin_folders():
        package = importlib.import_module(folder)
        found.extend(f"{folder}.{m.name}" for m in pkgutil.iter_modules(package.__path__))
    return found


def test_plugin_folders_are_packages() -> None:
    """Every source module of the "plugins see only..." contract is a folder of plugins, not a module."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("plugins see only")
    )
    assert set(plugin_folders()) == set(contract["source_modules"])


@pytest.mark.parametrize("module", modules_in_plugin_folders())
def test_every_module_in_a_plugin_folder_defines_a_plugin(module: str) -> None:
    mod = importlib.import_module(module)
    plugins = [
        c
        for _, c in inspect.getmembers(mod, inspect.isclass)
        if c.__module__ == module and isinstance(getattr(c, "TYPE", None), str)
    ]
    if module in NOT_YET_MOVED:
        assert not plugins, f"{module} now defines a plugin: drop it from NOT_YET_MOVED"
        return
    assert plugins, f"{module} defines no plugin class (with TYPE): move the helper beside the folder"
