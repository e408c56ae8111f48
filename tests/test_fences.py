"""Issue #14: each fenced re-implementation is a leaf with a test against its reference.

import-linter enforces the leaf part (the "fenced re-implementations are leaves" contract
in pyproject.toml); this checks that the contract still forbids every EPP module, and that
each fenced module names its reference, and has its differential or property test file.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def fence_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"].startswith("fenced re-implementations are leaves"))


FENCED: list[str] = fence_contract()["source_modules"]


def test_the_fence_forbids_all_of_the_epp() -> None:
    assert fence_contract()["forbidden_modules"] == ["epp.*"]
    assert {"epp.cel", "epp.metrics.fast", "epp.parsers.gojson", "epp.pflag", "epp.units"} <= set(FENCED)


@pytest.mark.parametrize("module", FENCED)
def test_fenced_module_names_its_reference_and_has_its_test(module: str) -> None:
    doc = importlib.import_module(module).__doc__ or ""
    assert "leaf" in doc.lower(), f"{module}: the docstring should say it is a leaf"
    assert "reference" in doc.lower(), (
        f"{module}: the docstring should name its reference (or that none exists)"
    )
    parts = module.split(".")[1:]
    test = ROOT / "tests" / Path(*parts[:-1]) / f"test_{parts[-1]}.py"
    assert test.exists(), f"{module}: expected its tests in {test.relative_to(ROOT)}"
    assert "hypothesis" in test.read_text(), f"{test.relative_to(ROOT)} should test on hypothesis input"
