"""One registry from plugin type name to class; building a plugin validates its parameters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from epp.errors import ConfigError
from epp.plugin.base import Handle, Plugin, PluginParams

ENTRY_POINT_GROUP = "epp.plugins"


def format_validation_error(prefix: str, err: ValidationError) -> str:
    """``prefix.field.sub: message`` lines, one per pydantic error."""
    lines = []
    for e in err.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        path = (f"{prefix}.{loc}" if prefix else loc) if loc else prefix
        lines.append(f"{path}: {e['msg']}")
    return "; ".join(lines)


class Registry:
    """Maps GIE type strings to plugin classes.  Built once at startup; never global."""

    __slots__ = ("_types",)

    def __init__(self, classes: Iterable[type[Plugin]] = ()) -> None:
        self._types: dict[str, type[Plugin]] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type[Plugin]) -> None:
        type_name = getattr(cls, "TYPE", None)
        if not isinstance(type_name, str) or not type_name:
            raise ConfigError(f"plugin class {cls.__qualname__} has no TYPE string")
        if not isinstance(getattr(cls, "PARAMS", None), type) or not issubclass(cls.PARAMS, PluginParams):
            raise ConfigError(f"plugin class {cls.__qualname__} ({type_name}) has no PARAMS model")
        existing = self._types.get(type_name)
        if existing is not None and existing is not cls:
            raise ConfigError(
                f"plugin type '{type_name}' registered twice: {existing.__qualname__} and {cls.__qualname__}"
            )
        self._types[type_name] = cls

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register out-of-tree plugins that installed packages declare under ``group``."""
        for ep in entry_points(group=group):
            try:
                obj = ep.load()
            except Exception as e:
                raise ConfigError(f"failed to load plugin entry point '{ep.name}' ({ep.value}): {e}") from e
            classes = obj if isinstance(obj, (list, tuple)) else (obj,)
            for cls in classes:
                self.register(cls)

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._types

    def types(self) -> Mapping[str, type[Plugin]]:
        return dict(self._types)

    def get(self, type_name: str) -> type[Plugin]:
        try:
            return self._types[type_name]
        except KeyError:
            raise ConfigError(f"plugin type '{type_name}' is not registered") from None

    def build(self, *, name: str, type_name: str, parameters: Any, handle: Handle, path: str) -> Plugin:
        """Validate ``parameters`` against the type's PARAMS and instantiate it.

        ``path`` is the config location (e.g. ``plugins[3]``) used to prefix every error.
        """
        cls = self.get(type_name)
        raw = {} if parameters is None else parameters
        try:
            params = cls.PARAMS.model_validate(raw)
        except ValidationError as e:
            raise ConfigError(format_validation_error(f"{path}.parameters", e)) from None
        try:
            plugin = cls(name, params, handle)  # type: ignore[call-arg]
        except ConfigError as e:
            raise ConfigError(f"{path} ({name}/{type_name}): {e}") from None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path} ({name}/{type_name}): failed to create plugin: {e}") from None
        return plugin
