"""Building plugins outside a config: a fixed Handle and a constructor from camelCase parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.plugin.base import PluginParams


class FakeHandle:
    """A :class:`epp.plugin.base.Handle` over a fixed list of plugins, looked up by instance name."""

    def __init__(self, plugins: Sequence[Any] = ()) -> None:
        self._plugins = list(plugins)

    def plugin(self, name: str) -> Any:
        for p in self._plugins:
            if p.typed_name.name == name:
                return p
        raise KeyError(name)

    def plugins(self) -> Sequence[Any]:
        return self._plugins


def build(cls: Any, name: str = "", handle: FakeHandle | None = None, **params: Any) -> Any:
    """Instantiate plugin ``cls`` from camelCase ``params`` validated by its PARAMS model.

    The instance is named ``name`` (default: the plugin's TYPE) and sees ``handle`` (default: an
    empty :class:`FakeHandle`).
    """
    p: PluginParams = cls.PARAMS.model_validate(params)
    return cls(name or cls.TYPE, p, handle or FakeHandle())
