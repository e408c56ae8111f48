"""What a concept's assembly sees of the plugins being built (issue #14: one assembly per concept).

The config layer instantiates plugins through the registry; each concept (scheduling, flow
control, data layer, request control) then assembles its runtime object from them in its own
``assembly`` module.  Those modules sit below ``epp.config`` in the import layers, so they
cannot call the registry: they get a ``PluginSet`` instead, which the config builder
implements.  ``ensure`` is how a concept asks for a default plugin by type name; the builder
instantiates it, so the order plugins are created in (and every error message) stays the
config loader's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from epp.plugin.base import Plugin


class PluginSet(Protocol):
    """The plugins of one build, by name in creation order, growing as defaults are added."""

    def get(self, name: str) -> Plugin | None:
        """The plugin named ``name``, or None."""
        ...

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...

    def values(self) -> tuple[Plugin, ...]:
        """Every plugin built so far, in creation order."""
        ...

    def ensure(self, type_name: str, why: str) -> Plugin:
        """The plugin named ``type_name``, instantiated with default parameters if absent.

        ``why`` is the config path that needed it, for the error when the type is unknown.
        """
        ...

    def registered(self, type_name: str) -> bool:
        """Whether the registry knows ``type_name``."""
        ...

    def create(self, type_name: str, path: str) -> Plugin:
        """Instantiate ``type_name`` with default parameters under its own name."""
        ...


def label(plugin: object) -> str:
    """``name/type`` of a plugin for messages; ``repr`` of anything else."""
    typed_name = getattr(plugin, "typed_name", None)
    return str(typed_name) if typed_name is not None else repr(plugin)
