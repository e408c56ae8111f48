"""Go's textual units, shared by flags, config and plugin parameters: durations and %q quoting."""

from __future__ import annotations

import json
from typing import Final

_INT64_MAX: Final = (1 << 63) - 1
_DURATION_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


def go_quote(s: str) -> str:
    """Go's ``%q`` for the strings we quote (printable text quotes the same as JSON)."""
    return json.dumps(s, ensure_ascii=False)


def parse_go_duration(s: str) -> float:
    """Go's ``time.ParseDuration`` (``50ms``, ``1m30s``, ``1.5h``, ``-2s``, ``0``) as float seconds."""
    orig, i = s, 0
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"time: invalid duration {go_quote(orig)}")
    total = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j].isascii() and s[j].isdigit():
            j += 1
        whole = s[i:j]
        frac = ""
        if j < len(s) and s[j] == ".":
            k = j + 1
            while k < len(s) and s[k].isascii() and s[k].isdigit():
                k += 1
            frac, j = s[j + 1 : k], k
        if not whole and not frac:
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        k = j
        while k < len(s) and s[k] != "." and not (s[k].isascii() and s[k].isdigit()):
            k += 1
        unit = s[j:k]
        if not unit:
            raise ValueError(f"time: missing unit in duration {go_quote(orig)}")
        scale = _DURATION_UNITS.get(unit)
        if scale is None:
            raise ValueError(f"time: unknown unit {go_quote(unit)} in duration {go_quote(orig)}")
        ns = int(whole or "0") * scale
        if frac:
            ns += int(frac) * scale // 10 ** len(frac)
        total += ns
        if total > _INT64_MAX:
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        i = k
    return (-total if neg else total) / 1e9
