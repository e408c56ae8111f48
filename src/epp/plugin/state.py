"""CycleState: the one per-request scratch bag shared by producers, filters, scorers and pickers."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

from epp.plugin.keys import AttributeKey, StateKey

T = TypeVar("T")

_EMPTY: Mapping[Any, Any] = {}


class CycleState:
    """Typed per-request data: per-endpoint attributes and request-level values.

    Asyncio runs one request's hooks at a time, so no lock is needed; one CycleState
    lives exactly as long as its request.
    """

    __slots__ = ("_attrs", "_values")

    def __init__(self) -> None:
        self._attrs: dict[AttributeKey[Any], dict[Hashable, Any]] = {}
        self._values: dict[StateKey[Any], Any] = {}

    # per-endpoint attributes ------------------------------------------------------
    def put_attribute(self, key: AttributeKey[T], endpoint: Hashable, value: T) -> None:
        per = self._attrs.get(key)
        if per is None:
            per = self._attrs[key] = {}
        per[endpoint] = value

    def set_attributes(self, key: AttributeKey[T], values: dict[Hashable, T]) -> None:
        """Replace every endpoint's value for ``key`` at once (the fast path for producers)."""
        self._attrs[key] = values

    def attribute(self, key: AttributeKey[T], endpoint: Hashable) -> T | None:
        per = self._attrs.get(key)
        return None if per is None else per.get(endpoint)

    def attributes(self, key: AttributeKey[T]) -> Mapping[Hashable, T]:
        """Every endpoint's value for ``key``; empty if no producer wrote it."""
        per = self._attrs.get(key)
        return _EMPTY if per is None else per

    # request-level values ---------------------------------------------------------
    def put(self, key: StateKey[T], value: T) -> None:
        self._values[key] = value

    def get(self, key: StateKey[T]) -> T | None:
        return self._values.get(key)
