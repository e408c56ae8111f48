"""Hatch build hook: generate the private Envoy ext_proc stubs before packaging."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ProtoStubsHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "epp-protos"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        spec = importlib.util.spec_from_file_location("gen_envoy_stubs", root / "protos" / "gen_envoy_stubs.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate(root / "src")
