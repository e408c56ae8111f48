"""Go ``encoding/json`` error texts, so our 400 bodies match GIE's for the usual bad bodies.

GIE answers a body that is not JSON with ``error unmarshaling request bodyMap: <Go error>``.
Go checks the whole input with its scanner before decoding, so the error names the first
offending byte and the scanner state there. ``syntax_error`` replays that scanner (states,
messages and ``quoteChar`` quoting copied from Go's ``encoding/json/scanner.go``) with regexes
for the long runs (whitespace, strings, numbers), so only tokens cost Python steps. It is run
only after orjson has refused the body, and gives up (returns None) past ``max_bytes`` or
``token_budget`` tokens, so a hostile body cannot make the error path expensive (Python's
regex engine scans character classes at only tens of MB/s).

What it re-implements: Go's ``encoding/json`` scanner (``checkValid``) and its error texts.
The reference is Go itself; no Python package reproduces Go's messages, and no Go
toolchain is installed here to run it, so tests/parsers/test_gojson.py checks recorded Go
messages plus properties on hypothesis-generated near-valid bodies and arbitrary bytes:
the replay accepts exactly what the stdlib ``json`` parser accepts (RFC 8259, with bytes
that are not UTF-8 allowed inside strings as Go allows them), and a reported character is
the byte at which a growing prefix first fails.  Parsing itself is orjson's; this module
only words the refusal.

A leaf: an import-linter contract in pyproject.toml keeps it from importing the EPP.
"""

from __future__ import annotations

import re
from typing import Final

END_OF_INPUT: Final = "unexpected end of JSON input"
MAX_DEPTH: Final = 10_000  # Go's maxNestingDepth
DEFAULT_TOKEN_BUDGET: Final = 100_000
DEFAULT_MAX_BYTES: Final = 256 * 1024

_SPACE = re.compile(rb"[ \t\r\n]*")
# A complete, valid JSON string; on failure _STRING_PREFIX finds where it breaks.
_STRING = re.compile(rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"')
_STRING_PREFIX = re.compile(rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
_HEX = re.compile(rb"[0-9a-fA-F]{0,4}")
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?P<frac>\.[0-9]+)?(?P<exp>[eE][+-]?[0-9]+)?")
_LITERALS: Final = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
_DIGITS: Final = frozenset(b"-0123456789")
_GO_ESCAPES: Final = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r"}

# Scanner modes (what the next non-space byte must be).
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _AFTER = range(5)
# Parse-state stack entries, as in Go: inside an object before ':', after ':', inside an array.
_OBJ_KEY, _OBJ_VALUE, _ARRAY = range(3)


class _Stop(Exception):
    """Carries the scanner's verdict out of nested helpers (None: gave up)."""

    def __init__(self, message: str | None) -> None:
        super().__init__(message)
        self.message = message


class _Input:
    """The bytes under scan and how far the scan may look (``end`` <= ``len(data)``)."""

    __slots__ = ("data", "end", "truncated")

    def __init__(self, data: bytes, max_bytes: int) -> None:
        self.data = data
        self.end = min(len(data), max_bytes)
        self.truncated = self.end < len(data)

    def eof(self) -> _Stop:
        """Running out of input is Go's error only if the input really ended here."""
        return _Stop(None if self.truncated else END_OF_INPUT)


def quote_char(c: int) -> str:
    """Go's ``quoteChar``: the byte as a rune in single quotes, escaped like ``strconv.Quote``."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    if c == 0x5C:
        return "'\\\\'"
    if c in _GO_ESCAPES:
        return f"'\\{_GO_ESCAPES[c]}'"
    if c < 0x20 or c == 0x7F:
        return f"'\\x{c:02x}'"
    if 0x80 <= c <= 0xA0 or c == 0xAD:  # C1 controls, NBSP and soft hyphen are not printable in Go
        return f"'\\u{c:04x}'"
    return f"'{chr(c)}'"


def _error(c: int, context: str) -> _Stop:
    return _Stop(f"invalid character {quote_char(c)} {context}")


def _string_end(src: _Input, pos: int) -> int:
    """End offset of the string starting at ``pos``, or raise the Go error inside it."""
    data, n = src.data, src.end
    m = _STRING.match(data, pos, n)
    if m is not None:
        return m.end()
    i = _STRING_PREFIX.match(data, pos, n).end()  # type: ignore[union-attr]  # always matches '"'
    if i >= n:
        raise src.eof()
    c = data[i]
    if c != 0x5C:  # a control character
        raise _error(c, "in string literal")
    if i + 1 >= n:
        raise src.eof()
    e = data[i + 1]
    if e != ord("u"):
        raise _error(e, "in string escape code")
    j = _HEX.match(data, i + 2, n).end()  # type: ignore[union-attr]  # {0,4} always matches
    if j >= n:
        raise src.eof()
    raise _error(data[j], "in \\u hexadecimal character escape")


def _number_end(src: _Input, pos: int) -> int:
    """End offset of the number starting at ``pos``, or raise the Go error inside it."""
    data, n = src.data, src.end
    m = _NUMBER.match(data, pos, n)
    if m is None:  # '-' not followed by a digit
        if pos + 1 >= n:
            raise src.eof()
        raise _error(data[pos + 1], "in numeric literal")
    end = m.end()
    if end >= n:
        if src.truncated:  # the number may go on past the window
            raise src.eof()
        return end
    c = data[end]
    if c == 0x2E and m.group("frac") is None and m.group("exp") is None:
        if end + 1 >= n:
            raise src.eof()
        raise _error(data[end + 1], "after decimal point in numeric literal")
    if c in (0x65, 0x45) and m.group("exp") is None:
        j = end + 1
        if j < n and data[j] in (0x2B, 0x2D):
            j += 1
        if j >= n:
            raise src.eof()
        raise _error(data[j], "in exponent of numeric literal")
    return end


def _literal_end(src: _Input, pos: int) -> int:
    """End offset of ``true``/``false``/``null`` at ``pos``, or raise the Go error inside it."""
    data, n = src.data, src.end
    word = _LITERALS[data[pos]]
    for k in range(1, len(word)):
        if pos + k >= n:
            raise src.eof()
        if data[pos + k] != word[k]:
            raise _error(data[pos + k], f"in literal {word.decode()} (expecting '{chr(word[k])}')")
    return pos + len(word)


def syntax_error(
    data: bytes, token_budget: int = DEFAULT_TOKEN_BUDGET, max_bytes: int = DEFAULT_MAX_BYTES
) -> str | None:
    """The message Go's ``json.Unmarshal`` gives for ``data``'s first syntax error.

    None when Go's scanner accepts the input, or when it gave up before finding the error.
    """
    try:
        _scan(_Input(data, max_bytes), token_budget)
    except _Stop as stop:
        return stop.message
    return None


def _scan(src: _Input, budget: int) -> None:
    data, n = src.data, src.end
    stack: list[int] = []
    mode = _VALUE
    pos = 0
    while budget > 0:
        budget -= 1
        pos = _SPACE.match(data, pos, n).end()  # type: ignore[union-attr]  # '*' always matches
        if pos >= n:
            if mode == _AFTER and not stack and not src.truncated:
                return
            raise src.eof()
        c = data[pos]
        if mode == _AFTER:
            if not stack:
                raise _error(c, "after top-level value")
            top = stack[-1]
            if top == _OBJ_KEY:
                if c != 0x3A:
                    raise _error(c, "after object key")
                stack[-1] = _OBJ_VALUE
                mode = _VALUE
            elif top == _OBJ_VALUE:
                if c == 0x2C:
                    stack[-1] = _OBJ_KEY
                    mode = _KEY
                elif c == 0x7D:
                    stack.pop()
                else:
                    raise _error(c, "after object key:value pair")
            elif c == 0x2C:
                mode = _VALUE
            elif c == 0x5D:
                stack.pop()
            else:
                raise _error(c, "after array element")
            pos += 1
            continue
        if mode in (_KEY, _KEY_OR_CLOSE):
            if mode == _KEY_OR_CLOSE and c == 0x7D:
                stack.pop()
                pos += 1
            elif c == 0x22:
                pos = _string_end(src, pos)
            else:
                raise _error(c, "looking for beginning of object key string")
            mode = _AFTER
            continue
        # _VALUE or _VALUE_OR_CLOSE
        if c == 0x5D and mode == _VALUE_OR_CLOSE:
            stack.pop()
            pos += 1
            mode = _AFTER
        elif c == 0x7B or c == 0x5B:
            stack.append(_OBJ_KEY if c == 0x7B else _ARRAY)
            if len(stack) > MAX_DEPTH:
                raise _error(c, "exceeded max depth")
            mode = _KEY_OR_CLOSE if c == 0x7B else _VALUE_OR_CLOSE
            pos += 1
        elif c == 0x22:
            pos = _string_end(src, pos)
            mode = _AFTER
        elif c in _DIGITS:
            pos = _number_end(src, pos)
            mode = _AFTER
        elif c in _LITERALS:
            pos = _literal_end(src, pos)
            mode = _AFTER
        else:
            raise _error(c, "looking for beginning of value")


def kind(value: object) -> str:
    """The JSON kind Go's ``UnmarshalTypeError`` names for a decoded value."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    return "number"


def type_error(value: object, target: str = "map[string]interface {}") -> str:
    """Go's error for decoding a non-object top-level value into ``target`` (default ``map[string]any``)."""
    return f"json: cannot unmarshal {kind(value)} into Go value of type {target}"


def field_type_error(value: object, struct: str, field: str, go_type: str) -> str:
    """Go's error for a struct field of the wrong JSON kind (the decode goes on; this is returned)."""
    return f"json: cannot unmarshal {kind(value)} into Go struct field {struct}.{field} of type {go_type}"
