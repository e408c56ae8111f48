"""Typed keys: how plugins share data without importing each other."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class AttributeKey(Generic[T]):
    """Names a per-endpoint datum that a producer writes for one request and consumers read.

    Keys are module-level constants; identity is the object.  ``value_type`` is checked
    when the producer DAG is built, so two plugins that disagree on a key's type fail
    at startup rather than at request time.
    """

    __slots__ = ("default_producer", "name", "value_type")

    def __init__(self, name: str, value_type: type[T], *, default_producer: str = "") -> None:
        self.name = name
        self.value_type = value_type
        # Plugin type instantiated automatically when something consumes this key and
        # no configured plugin produces it ("" = none: the consumer is a config error).
        self.default_producer = default_producer

    def __repr__(self) -> str:
        return f"AttributeKey({self.name!r}, {self.value_type.__name__})"


class StateKey(Generic[T]):
    """Names a request-level value in the cycle state (not per endpoint)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"
