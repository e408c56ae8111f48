"""Label and field selectors with the apiserver's grammar and matching rules.

Watchers depend on the server filtering, not on filtering client-side: an object that
stops matching must reach a watcher as DELETED, so the fake must evaluate selectors itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .resources import Resource
from .status import ApiError

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_NOT_EXISTS = re.compile(rf"!\s*(?P<key>{_KEY})")
_EXISTS = re.compile(rf"(?P<key>{_KEY})")
_EQUALITY = re.compile(rf"(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})")
_SET = re.compile(rf"(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")
_ORDER = re.compile(rf"(?P<key>{_KEY})\s*(?P<op>[<>])\s*(?P<value>-?[0-9]+)")
_VALUE_ONLY = re.compile(_VALUE)

Predicate = Callable[[Mapping[str, str]], bool]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed ``labelSelector``: every requirement must hold (they are ANDed)."""

    requirements: tuple[Predicate, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(req(labels) for req in self.requirements)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A parsed ``fieldSelector``: (field, equal?, value) terms, ANDed."""

    terms: tuple[tuple[str, bool, str], ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all((fields.get(field, "") == value) == equal for field, equal, value in self.terms)


def parse_labels(text: str) -> LabelSelector:
    """Parse a label selector; a malformed one is a 400 like the apiserver's."""
    return LabelSelector(tuple(_requirement(part.strip(), text) for part in _split(text) if part.strip()))


def parse_fields(text: str, resource: Resource) -> FieldSelector:
    """Parse a field selector; fields the resource does not index are a 400, as in the apiserver."""
    terms = []
    allowed = {"metadata.name", "metadata.namespace", *resource.field_labels}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(?P<field>[A-Za-z0-9_.]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)", part)
        if m is None:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        if m["field"] not in allowed:
            raise ApiError(400, f"field label not supported: {m['field']}")
        terms.append((m["field"], m["op"] != "!=", m["value"].strip()))
    return FieldSelector(tuple(terms))


def object_fields(obj: Mapping[str, Any], resource: Resource) -> dict[str, str]:
    """The field set a field selector is evaluated against (missing fields are the empty string)."""
    md = obj.get("metadata", {})
    fields = {"metadata.name": md.get("name", ""), "metadata.namespace": md.get("namespace", "")}
    for label in resource.field_labels:
        node: Any = obj
        for step in label.split("."):
            node = node.get(step) if isinstance(node, Mapping) else None
        fields[label] = "" if node is None else str(node)
    return fields


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` is two requirements)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _requirement(part: str, text: str) -> Predicate:
    if m := _SET.fullmatch(part):
        values = frozenset(v.strip() for v in m["values"].split(","))
        if not all(_VALUE_ONLY.fullmatch(v) for v in values):
            raise ApiError(400, f"unable to parse requirement: invalid label value in '{part}'")
        key = m["key"]
        if m["op"] == "in":
            return lambda labels: key in labels and labels[key] in values
        return lambda labels: key not in labels or labels[key] not in values
    if m := _EQUALITY.fullmatch(part):
        key, value = m["key"], m["value"]
        if m["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: key in labels and labels[key] == value
    if m := _ORDER.fullmatch(part):
        key, bound, greater = m["key"], int(m["value"]), m["op"] == ">"
        return lambda labels: _compare(labels.get(key), bound, greater)
    if m := _NOT_EXISTS.fullmatch(part):
        key = m["key"]
        return lambda labels: key not in labels
    if m := _EXISTS.fullmatch(part):
        key = m["key"]
        return lambda labels: key in labels
    raise ApiError(400, f"unable to parse requirement: couldn't parse '{part}' in selector '{text}'")


def _compare(value: str | None, bound: int, greater: bool) -> bool:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return False
    if number is None:
        return False
    return number > bound if greater else number < bound
