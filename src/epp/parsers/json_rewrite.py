"""Rewrite the top-level ``model`` of a JSON body in place, keeping every other byte as sent.

GIE re-encodes the whole map (sorted keys, HTML escaping, numbers through float64). Splicing the
new value into the original bytes is cheaper on large bodies and leaves the client's JSON
untouched. Finding the value must be sound: a nested ``"model"`` key (a tool schema property,
message metadata) must never be taken for the top-level one, or a rewrite could be dodged.
"""

from __future__ import annotations

import re
from typing import Final

import orjson

_LITERAL_KEY: Final = b'"model"'
_ESCAPED_LETTER: Final = b"\\u006"  # how m, o, d, e and l start when \u-escaped
# A key that decodes to "model", in any spelling (each letter literal or \u-escaped).
_ANY_SPELLING = re.compile(rb'"(?:m|\\u006[dD])(?:o|\\u006[fF])(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006[cC])"')
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
# Tokens that move the nesting depth: whole strings (so brackets inside them are skipped) and brackets.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]]', re.DOTALL)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BACKSLASH: Final = 0x5C
_OPEN: Final = frozenset(b"{[")


def _quote_is_escaped(raw: bytes, quote: int) -> bool:
    n = 0
    i = quote - 1
    while i >= 0 and raw[i] == _BACKSLASH:
        n += 1
        i -= 1
    return n % 2 == 1


def _key_at(raw: bytes, quote: int, end: int) -> int | None:
    """Offset of the value after the string ``raw[quote:end]`` if that string is an object key."""
    if _quote_is_escaped(raw, quote):  # the text of some string, not a key
        return None
    colon = _COLON.match(raw, end)  # a string followed by ':' can only be a key
    return None if colon is None else colon.end()


def _model_keys(raw: bytes) -> list[tuple[int, int]]:
    """(key offset, value offset) of every object key that decodes to "model", at any depth.

    In valid JSON every quote inside a string is escaped, and an unescaped quote followed by
    ``model"`` and ``:`` can only open a key, so no structural scan is needed. Bodies without
    ``\\u006`` cannot spell the key with escapes, and take the plain ``bytes.find`` path.
    """
    keys: list[tuple[int, int]] = []
    if _ESCAPED_LETTER in raw:
        for m in _ANY_SPELLING.finditer(raw):
            value = _key_at(raw, m.start(), m.end())
            if value is not None:
                keys.append((m.start(), value))
        return keys
    i = raw.find(_LITERAL_KEY)
    while i != -1:
        end = i + len(_LITERAL_KEY)
        value = _key_at(raw, i, end)
        if value is not None:
            keys.append((i, value))
        i = raw.find(_LITERAL_KEY, end)
    return keys


def _at_top_level(raw: bytes, keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The subset of ``keys`` directly inside the top-level object, by tracking depth over tokens."""
    wanted = dict(keys)
    found: list[tuple[int, int]] = []
    depth = 0
    last = keys[-1][0]
    for tok in _TOKEN.finditer(raw):
        start = tok.start()
        c = raw[start]
        if c == 0x22:
            if depth == 1 and start in wanted:
                found.append((start, wanted[start]))
            if start >= last:
                break
        elif c in _OPEN:
            depth += 1
        else:
            depth -= 1
    return found


def _string_value(raw: bytes, at: int) -> tuple[int, int] | None:
    value = _STRING.match(raw, at)
    return None if value is None else (value.start(), value.end())


def model_value_span(raw: bytes, current: str) -> tuple[int, int] | None:
    """Byte span of the top-level ``model`` string value, else None.

    ``raw`` must be a valid JSON object whose top-level ``model`` decodes to ``current`` (the
    parser checked both). That key is always among the candidates, so a single candidate is it;
    among several, the only one whose value decodes to ``current`` is it; otherwise the
    nesting depth decides. None when the top level repeats the key (re-encode instead).
    """
    keys = _model_keys(raw)
    if len(keys) > 1:
        same = []
        for key in keys:
            span = _string_value(raw, key[1])
            if span is not None and _decodes_to(raw[span[0] : span[1]], current):
                same.append(key)
        keys = same if len(same) == 1 else _at_top_level(raw, keys)
    if len(keys) != 1:
        return None
    return _string_value(raw, keys[0][1])


def _decodes_to(literal: bytes, text: str) -> bool:
    try:
        return bool(orjson.loads(literal) == text)
    except orjson.JSONDecodeError:
        return False


def replace_model(raw: bytes, current: str, model: str) -> bytes | None:
    """``raw`` with its top-level model ``current`` replaced by ``model``; None if not located."""
    span = model_value_span(raw, current)
    if span is None:
        return None
    view = memoryview(raw)
    return b"".join((view[: span[0]], orjson.dumps(model), view[span[1] :]))
