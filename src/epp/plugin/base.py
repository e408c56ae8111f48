"""What every plugin is: a ``TYPE``, typed ``PARAMS`` and a typed name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


@dataclass(frozen=True, slots=True)
class TypedName:
    """``name/type``: how a plugin is named in logs, errors and metric labels."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.name}/{self.type}"


class PluginParams(BaseModel):
    """Base of every plugin's parameters: frozen, strict about unknown keys, camelCase in YAML."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
    )


class NoParams(PluginParams):
    """For plugins that take no parameters."""


@runtime_checkable
class Plugin(Protocol):
    """Anything the registry can build from a config entry."""

    TYPE: ClassVar[str]
    PARAMS: ClassVar[type[PluginParams]]

    @property
    def typed_name(self) -> TypedName: ...


class Handle(Protocol):
    """What a plugin may ask of the runtime while it is being built or started."""

    def plugin(self, name: str) -> Any:
        """The plugin instance named ``name``; raises ``KeyError`` if there is none."""
        ...

    def plugins(self) -> Sequence[Any]:
        """All instantiated plugins, in config order."""
        ...


class PluginBase:
    """Optional convenience base: stores the typed name; subclasses add their own state.

    Subclasses set ``TYPE`` (GIE's type string, verbatim) and, if they take parameters,
    ``PARAMS``; their ``__init__(name, params, handle)`` receives validated parameters.
    """

    TYPE: ClassVar[str]
    PARAMS: ClassVar[type[PluginParams]] = NoParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        del params, handle
        self._typed_name = TypedName(self.TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._typed_name}>"


@runtime_checkable
class Lifecycle(Protocol):
    """Plugins with background work implement this; the runtime starts and stops them."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class DebugState(Protocol):
    """Plugins with state worth seeing implement this: ``/debug/plugins/state`` shows it as JSON.

    Called off the request path, on demand; return plain JSON types and keep it cheap (sizes,
    counters, a bounded sample), never the whole structure.
    """

    def debug_state(self) -> dict[str, Any]: ...
