"""Go's textual values, shared by flags, config and plugin parameters: durations, ints, bools, %q.

GIE reads its flags with pflag and its config with Go's ``time.ParseDuration`` and
``strconv``; a drop-in must accept and reject the same text with the same messages.  These
functions port Go's algorithms (``time/format.go``: ``ParseDuration``, ``Duration.String``;
``strconv``: ``ParseBool``, ``ParseInt(s, 0, 64)``, ``Atoi``, ``Quote``) rather than
approximating them with Python's parsers.

No reference implementation exists in Python (nothing on PyPI ports ``time.ParseDuration``
or pflag's value parsers), and no Go toolchain is installed here to compare against, so
tests/test_units.py checks the documented properties on hypothesis-generated input instead:
Go's duration grammar ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` accepts exactly what a regex
of it accepts, values equal the exact decimal value to the nanosecond, every int64
duration survives ``format`` then ``parse``, and ``strconv`` agrees with Python's ``int``
wherever the two grammars overlap.

A leaf: an import-linter contract in pyproject.toml keeps it from importing the EPP.
"""

from __future__ import annotations

import re
from typing import Final

_INT64_MAX: Final = (1 << 63) - 1
_INT64_MIN: Final = -(1 << 63)
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
_SECOND: Final = 1_000_000_000

_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_GO_INT: Final = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*|[1-9](?:_?[0-9])*)"
)
_GO_ATOI: Final = re.compile(r"[+-]?[0-9]+")
_QUOTE_ESCAPES: Final = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` (``%q``): printable runes as they are, the rest escaped.

    Go's ``IsPrint`` is approximated by ``str.isprintable`` (both: letters, marks, numbers,
    punctuation, symbols and the ASCII space); they can differ only where the two Unicode
    versions do.
    """
    if s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = ['"']
    for c in s:
        esc = _QUOTE_ESCAPES.get(c)
        if esc is not None:
            out.append(esc)
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


# --- durations ------------------------------------------------------------------------------------


def _time_quote(s: str) -> str:
    """The ``time`` package's own ``quote`` (its error texts): bytes outside printable ASCII as ``\\xNN``."""
    out = ['"']
    for c in s:
        if c < " " or c >= "\x80":
            out.extend(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogatepass"))
        else:
            if c in '"\\':
                out.append("\\")
            out.append(c)
    out.append('"')
    return "".join(out)


def parse_go_duration(s: str) -> float:
    """Go's ``time.ParseDuration`` (``50ms``, ``1m30s``, ``1.5h``, ``-2s``, ``0``) as float seconds."""
    return parse_go_duration_ns(s) / 1e9


def parse_go_duration_ns(s: str) -> int:
    """Go's ``time.ParseDuration`` as int64 nanoseconds, step for step (errors included).

    A fraction is scaled in float64 and truncated, as Go does (``uint64(float64(f) *
    (float64(unit) / scale))``); fraction digits past what a uint64 holds are ignored.
    One deliberate difference: Go's running uint64 sum wraps when two components of 2^63 ns
    each are added (``9223372036854775808ns9223372036854775808ns`` parses as 0 in Go); here
    that is an invalid duration.
    """
    orig = s
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"time: invalid duration {_time_quote(orig)}")
    total = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if not (c == "." or "0" <= c <= "9"):
            raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        j = i
        while j < n and "0" <= s[j] <= "9":
            j += 1
        pre = j > i
        v = int(s[i:j]) if pre else 0
        if v > 1 << 63:  # Go's leadingInt overflows
            raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        f, scale, post = 0, 1.0, False
        if j < n and s[j] == ".":
            j += 1
            k = j
            overflow = False
            while k < n and "0" <= s[k] <= "9":
                if not overflow:
                    y = f * 10 + ord(s[k]) - 48
                    if f > _INT64_MAX // 10 or y > 1 << 63:
                        overflow = True
                    else:
                        f = y
                        scale *= 10
                k += 1
            post = k > j
            j = k
        if not pre and not post:
            raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        k = j
        while k < n and not (s[k] == "." or "0" <= s[k] <= "9"):
            k += 1
        if k == j:
            raise ValueError(f"time: missing unit in duration {_time_quote(orig)}")
        unit_text = s[j:k]
        unit = _DURATION_UNITS.get(unit_text)
        if unit is None:
            raise ValueError(f"time: unknown unit {_time_quote(unit_text)} in duration {_time_quote(orig)}")
        if v > (1 << 63) // unit:
            raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > 1 << 63:
                raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        total += v
        if total > 1 << 63:
            raise ValueError(f"time: invalid duration {_time_quote(orig)}")
        i = k
    if neg:
        return -total
    if total > _INT64_MAX:
        raise ValueError(f"time: invalid duration {_time_quote(orig)}")
    return total


def format_go_duration(seconds: float) -> str:
    """Go's ``Duration.String`` of ``seconds`` rounded to the nanosecond (``50ms``, ``1m30s``)."""
    return format_go_duration_ns(round(seconds * 1e9))


def format_go_duration_ns(ns: int) -> str:
    """Go's ``Duration.String``: ``0s``, ``1.5µs``, ``50ms``, ``1m30s``, ``2h0m0.5s``, ``-1s``."""
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise ValueError(f"duration {ns}ns is outside int64")
    sign, u = ("-", -ns) if ns < 0 else ("", ns)
    if u < _SECOND:
        if u == 0:
            return "0s"
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{_frac(u, 3)}\u00b5s"
        return f"{sign}{_frac(u, 6)}ms"
    minutes, sec_ns = divmod(u, 60 * _SECOND)
    hours, minutes = divmod(minutes, 60)
    secs = f"{_frac(sec_ns, 9)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return f"{sign}{secs}"


def _frac(v: int, prec: int) -> str:
    """``v / 10**prec`` in decimal without trailing zeros (Go's ``fmtFrac`` then ``fmtInt``)."""
    whole, frac = divmod(v, 10**prec)
    digits = f"{frac:0{prec}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


# --- strconv --------------------------------------------------------------------------------------


def parse_go_bool(s: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if s in _GO_TRUE:
        return True
    if s in _GO_FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(s)}: invalid syntax")


def parse_go_int(s: str) -> int:
    """Go's ``strconv.ParseInt(s, 0, 64)`` (pflag ints): 0x/0o/0b prefixes, leading-0 octal, ``_``."""
    if not _GO_INT.fullmatch(s):
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(s)}: invalid syntax")
    sign = -1 if s[0] == "-" else 1
    body = s.lstrip("+-").replace("_", "")
    leading_zero_octal = len(body) > 1 and body[0] == "0" and body[1].isdigit()
    n = sign * int(body, 8 if leading_zero_octal else 0)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(s)}: value out of range")
    return n


def parse_go_atoi(s: str) -> int:
    """Go's ``strconv.Atoi`` (pflag int-slice elements): base 10, optional sign, nothing else."""
    if not _GO_ATOI.fullmatch(s):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(s)}: invalid syntax")
    n = int(s)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise ValueError(f"strconv.Atoi: parsing {go_quote(s)}: value out of range")
    return n
