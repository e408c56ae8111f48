"""Building plugins outside a config: a fixed Handle and a constructor from camelCase parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from epp.plugin.base import Handle, PluginParams

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)


class PluginClass(Protocol[P_co]):
    """A plugin class as the registry sees it: its type name, its parameter model, its constructor."""

    TYPE: str
    PARAMS: type[PluginParams]

    def __call__(self, name: str, params: Any, handle: Handle, /) -> P_co: ...


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


def build(cls: PluginClass[P], name: str = "", handle: FakeHandle | None = None, **params: Any) -> P:
    """Instantiate plugin ``cls`` from camelCase ``params`` validated by its PARAMS model.

    The instance is named ``name`` (default: the plugin's TYPE) and sees ``handle`` (default: an
    empty :class:`FakeHandle`). The result has the plugin's own type, so a test's use of it is
    type-checked against the plugin, not against ``Any``.
    """
    p: PluginParams = cls.PARAMS.model_validate(params)
    return cls(name or cls.TYPE, p, handle or FakeHandle())
