"""Kubernetes label selectors (``labels.Parse``'s grammar), for plugins that scope by labels.

Why not ``epp.cli.flags.parse_selector``: that one is ``ConvertSelectorToLabelsMap`` (``k=v``
pairs only, what the pool flags take), while a plugin's ``labelSelector`` is a full selector:
``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``, comma-separated,
every requirement must hold.

A fenced re-implementation (issue #14): a leaf that imports nothing of the EPP.  No Python
library parses Kubernetes selectors (the kubernetes client passes them to the API server as
text), so there is no reference to test against: tests/test_labels.py
checks the documented grammar and, on hypothesis input, that a selector matches exactly when
each of its requirements holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

_KEY: Final = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE: Final = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT: Final = re.compile(
    rf"\s*(?:!\s*(?P<absent>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|=|!=)\s*(?P<value>{_VALUE})"
    rf"|\s(?P<set_op>in|notin)\s*\((?P<values>[^)]*)\))?)\s*(?P<end>,|$)"
)
_VALUE_ONLY: Final = re.compile(_VALUE)

Op = Literal["in", "notin", "exists", "absent"]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "absent":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        # notin (and !=) match a missing label, as Kubernetes' selectors do
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Every requirement must hold; the empty selector matches everything (as Kubernetes')."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def parse_label_selector(text: str) -> LabelSelector:
    """``labels.Parse``: raises ``ValueError`` naming the position of the first bad requirement."""
    requirements: list[Requirement] = []
    pos = 0
    while pos < len(text):
        m = _REQUIREMENT.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unable to parse requirement at position {pos} of {text!r}")
        if m.group("absent"):
            requirements.append(Requirement(m.group("absent"), "absent"))
        elif m.group("op"):
            op: Op = "notin" if m.group("op") == "!=" else "in"
            requirements.append(Requirement(m.group("key"), op, frozenset((m.group("value"),))))
        elif m.group("set_op"):
            values = [v.strip() for v in m.group("values").split(",")]
            if any(not _VALUE_ONLY.fullmatch(v) for v in values):
                raise ValueError(f"invalid label value in {m.group(0).strip()!r}")
            set_op: Op = "in" if m.group("set_op") == "in" else "notin"
            requirements.append(Requirement(m.group("key"), set_op, frozenset(values)))
        else:
            requirements.append(Requirement(m.group("key"), "exists"))
        pos = m.end()
        if m.group("end") == "," and pos >= len(text):
            raise ValueError(f"trailing ',' in {text!r}")
    return LabelSelector(tuple(requirements))
