"""The parsers concept registers GIE's three parsers and llm-d-router's three narrower ones."""

from __future__ import annotations

from typing import cast

from epp.parsers.api import Parser
from epp.parsers.builtin import BUILTINS
from epp.plugin.base import Handle
from epp.plugin.registry import Registry


def test_builtins_register_under_gie_types() -> None:
    """Every parser type builds from the registry as a Parser."""
    registry = Registry(BUILTINS)
    assert set(registry.types()) == {
        "openai-parser",
        "vllmgrpc-parser",
        "passthrough-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "vertexai-parser",
        "sglanghttp-parser",
    }
    for type_name in registry.types():
        plugin = registry.build(
            name=type_name, type_name=type_name, parameters=None, handle=cast(Handle, None), path="plugins[0]"
        )
        assert isinstance(plugin, Parser)
        assert str(plugin.typed_name) == f"{type_name}/{type_name}"
