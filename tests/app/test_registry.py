"""The production registry joins every concept's BUILTINS and installed entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import ClassVar

import pytest

import epp.plugin.registry as kernel_registry
from epp.app.registry import default_registry
from epp.datalayer.builtin import BUILTINS as DATALAYER
from epp.director.builtin import BUILTINS as DIRECTOR
from epp.flowcontrol.builtin import BUILTINS as FLOWCONTROL
from epp.k8s.builtin import BUILTINS as K8S
from epp.parsers.builtin import BUILTINS as PARSERS
from epp.plugin.base import PluginBase
from epp.scheduling.builtin import BUILTINS as SCHEDULING
from epp.sync.builtin import BUILTINS as SYNC


class OutOfTree(PluginBase):
    TYPE: ClassVar[str] = "out-of-tree-test-plugin"


def test_every_builtin_is_registered_under_its_type() -> None:
    """Each concept's BUILTINS class is reachable by its GIE type string."""
    registry = default_registry(entry_points=False)
    classes = (*SCHEDULING, *DIRECTOR, *PARSERS, *DATALAYER, *FLOWCONTROL, *SYNC, *K8S)
    assert {cls.TYPE: cls for cls in classes} == dict(registry.types())


def test_entry_point_plugins_are_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """Classes installed under the epp.plugins entry-point group become registrable types."""
    ep = EntryPoint(name="oot", value=f"{__name__}:OutOfTree", group="epp.plugins")
    monkeypatch.setattr(kernel_registry, "entry_points", lambda group: [ep] if group == "epp.plugins" else [])
    assert default_registry().get("out-of-tree-test-plugin") is OutOfTree
    assert "out-of-tree-test-plugin" not in default_registry(entry_points=False)
