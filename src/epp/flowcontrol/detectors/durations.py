"""Go ``time.ParseDuration`` for duration strings in plugin parameters (``"200ms"``, ``"1m30s"``)."""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_NUMBER: Final = re.compile(r"\d+\.?\d*|\.\d+")
_UNIT: Final = re.compile(r"[^\d.]*")


def parse_go_duration(text: str) -> float:
    """Seconds in ``text``; raises ``ValueError`` with Go's wording for malformed input."""
    s = text
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total = 0.0
    pos = 0
    while pos < len(s):
        num = _NUMBER.match(s, pos)
        if num is None:
            raise ValueError(f'time: invalid duration "{text}"')
        unit_match = _UNIT.match(s, num.end())
        unit = unit_match.group() if unit_match else ""
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        scale = _UNITS.get(unit)
        if scale is None:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        total += float(num.group()) * scale
        pos = num.end() + len(unit)
    return sign * total
