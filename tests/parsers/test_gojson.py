"""Go encoding/json error texts: the scanner replay and the top-level type errors.

Go's ``encoding/json`` is the reference and there is no Go here to run it, so the replay is
checked against Go's documented behaviour in three ways: recorded Go messages (the tables),
the stdlib ``json`` parser for *which* inputs are JSON (hypothesis-generated near-valid
bodies and arbitrary bytes), and the properties of an online scanner (the first error is
decided by the bytes up to the one it names).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from epp.parsers import gojson
from epp.units import go_quote

BODY_MAP = "json: cannot unmarshal {} into Go value of type map[string]interface {{}}"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b"no healthy upstream", "invalid character 'o' in literal null (expecting 'u')", id="gie-case-8"
        ),
        pytest.param(b"", "unexpected end of JSON input", id="empty"),
        pytest.param(b" \r\n\t", "unexpected end of JSON input", id="whitespace-only"),
        pytest.param(b"<html>", "invalid character '<' looking for beginning of value", id="html"),
        pytest.param(
            b"\xef\xbb\xbf{}", "invalid character '\u00ef' looking for beginning of value", id="bom"
        ),
        pytest.param(b"'x'", "invalid character '\\'' looking for beginning of value", id="single-quote"),
        pytest.param(b'{"a":NaN}', "invalid character 'N' looking for beginning of value", id="nan"),
        pytest.param(b'{"a" 1}', "invalid character '1' after object key", id="missing-colon"),
        pytest.param(
            b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair", id="missing-comma"
        ),
        pytest.param(b"[1 2]", "invalid character '2' after array element", id="array-missing-comma"),
        pytest.param(
            b"{1:2}", "invalid character '1' looking for beginning of object key string", id="bare-key"
        ),
        pytest.param(
            b'{"a":1,}',
            "invalid character '}' looking for beginning of object key string",
            id="trailing-comma",
        ),
        pytest.param(
            b"[1,]", "invalid character ']' looking for beginning of value", id="array-trailing-comma"
        ),
        pytest.param(
            b'{"a":tru}', "invalid character '}' in literal true (expecting 'e')", id="literal-true"
        ),
        pytest.param(
            b'{"a":fxlse}', "invalid character 'x' in literal false (expecting 'a')", id="literal-false"
        ),
        pytest.param(b'{"a":fals', "unexpected end of JSON input", id="literal-truncated"),
        pytest.param(b'{"a":-x}', "invalid character 'x' in numeric literal", id="minus-alone"),
        pytest.param(b'{"a":1.}', "invalid character '}' after decimal point in numeric literal", id="dot"),
        pytest.param(b'{"a":1e}', "invalid character '}' in exponent of numeric literal", id="exponent"),
        pytest.param(
            b'{"a":1E+}', "invalid character '}' in exponent of numeric literal", id="exponent-sign"
        ),
        pytest.param(b'{"a":01}', "invalid character '1' after object key:value pair", id="leading-zero"),
        pytest.param(
            b'{"a":1e5.3}', "invalid character '.' after object key:value pair", id="dot-after-exponent"
        ),
        pytest.param(b'{"a":"\x01"}', "invalid character '\\x01' in string literal", id="control-char"),
        pytest.param(b'{"a":"\t"}', "invalid character '\\t' in string literal", id="raw-tab"),
        pytest.param(b'{"a":"\\q"}', "invalid character 'q' in string escape code", id="bad-escape"),
        pytest.param(
            b'{"a":"\\u12x4"}',
            "invalid character 'x' in \\u hexadecimal character escape",
            id="bad-unicode-escape",
        ),
        pytest.param(b'{"a":"abc', "unexpected end of JSON input", id="unterminated-string"),
        pytest.param(b'{"model":"m","prompt":"x"', "unexpected end of JSON input", id="truncated-object"),
        pytest.param(b'{"a":1}x', "invalid character 'x' after top-level value", id="trailing-garbage"),
        pytest.param(b'{"a":1}}', "invalid character '}' after top-level value", id="extra-brace"),
        pytest.param(b"[" * 10_001, "invalid character '[' exceeded max depth", id="go-max-depth"),
        pytest.param(b'{"a":[1,-2.5e-3,true,false,null,"x\\u00e9\\n",{}],"b":{}}', None, id="valid"),
        pytest.param(b'{"a":"\xff\xfe"}', None, id="invalid-utf8-accepted-like-go"),
        pytest.param(b"[" * 2000 + b"]" * 2000, None, id="deep-but-under-go-limit"),
    ],
)
def test_syntax_error_matches_go(body: bytes, expected: str | None) -> None:
    """The first syntax error is reported with Go's exact wording, or None where Go accepts."""
    assert gojson.syntax_error(body) == expected


@pytest.mark.parametrize(
    ("body", "limits"),
    [
        pytest.param(b"[" + b"1," * 1000 + b"x", {"token_budget": 100}, id="token-budget"),
        pytest.param(b'{"a":"' + b"x" * 1000 + b'\x01"}', {"max_bytes": 500}, id="string-past-window"),
        pytest.param(b'{"a":' + b"1" * 1000 + b"x}", {"max_bytes": 500}, id="number-past-window"),
        pytest.param(b'{"a":"x"}' + b" " * 1000 + b"x", {"max_bytes": 500}, id="space-past-window"),
    ],
)
def test_syntax_error_gives_up_past_limits(body: bytes, limits: dict[str, int]) -> None:
    """Past the token or byte limit the replay gives up (None) instead of guessing or running long."""
    assert gojson.syntax_error(body, **limits) is None
    assert gojson.syntax_error(body) is not None


@pytest.mark.parametrize(
    ("byte", "expected"),
    [
        pytest.param(0x27, "'\\''", id="apostrophe"),
        pytest.param(0x22, "'\"'", id="double-quote"),
        pytest.param(0x5C, "'\\\\'", id="backslash"),
        pytest.param(0x0A, "'\\n'", id="newline"),
        pytest.param(0x0B, "'\\v'", id="vertical-tab"),
        pytest.param(0x00, "'\\x00'", id="nul"),
        pytest.param(0x7F, "'\\x7f'", id="del"),
        pytest.param(0x85, "'\\u0085'", id="c1-control"),
        pytest.param(0xA0, "'\\u00a0'", id="nbsp"),
        pytest.param(0xAD, "'\\u00ad'", id="soft-hyphen"),
        pytest.param(0xE9, "'\u00e9'", id="latin1-printable"),
        pytest.param(0x41, "'A'", id="ascii"),
    ],
)
def test_quote_char(byte: int, expected: str) -> None:
    """Bytes are quoted as Go's quoteChar does (the byte read as a Latin-1 rune)."""
    assert gojson.quote_char(byte) == expected


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        pytest.param([1], "array", id="array"),
        pytest.param("x", "string", id="string"),
        pytest.param(1.5, "number", id="number"),
        pytest.param(7, "number", id="integer"),
        pytest.param(True, "bool", id="bool"),
    ],
)
def test_type_error(value: object, kind: str) -> None:
    """A non-object top level gets Go's UnmarshalTypeError text for map[string]any."""
    assert gojson.type_error(value) == BODY_MAP.format(kind)


def test_quote_char_is_strconv_quote_of_the_byte_as_a_rune() -> None:
    """Every byte: Go's quoteChar is strconv.Quote(string(rune(c))) in single quotes, with ' and "
    special-cased; epp.units.go_quote is strconv.Quote, written independently."""
    for c in range(256):
        expected = {0x27: "'\\''", 0x22: "'\"'"}.get(c) or "'" + go_quote(chr(c))[1:-1] + "'"
        assert gojson.quote_char(c) == expected, hex(c)


# --- properties on hypothesis input ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
spaces = st.text(" \t\r\n", max_size=2)


@st.composite
def near_json(draw: st.DrawFn) -> bytes:
    """A JSON document with random whitespace, then maybe one byte edit: most edits break it."""
    text = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        text = text.replace(",", draw(spaces) + "," + draw(spaces)).replace(":", draw(spaces) + ":")
    data = draw(spaces).encode() + text.encode() + draw(spaces).encode()
    edit = draw(st.sampled_from(("none", "insert", "delete", "replace", "truncate")))
    if edit == "none" or not data:
        return data
    i = draw(st.integers(0, len(data) - 1))
    byte = bytes([draw(st.sampled_from(b'{}[]:,"\\ -+.0123456789eEtfnulrsa\x00\x1f\x7f\xc3\xff'))])
    if edit == "insert":
        return data[:i] + byte + data[i:]
    if edit == "delete":
        return data[:i] + data[i + 1 :]
    if edit == "replace":
        return data[:i] + byte + data[i + 1 :]
    return data[:i]


def stdlib_accepts(data: bytes) -> bool:
    """RFC 8259 JSON per the stdlib parser, bytes that are not UTF-8 kept as lone surrogates
    (inside strings Go accepts any byte >= 0x20, and json any character)."""

    def no_constants(name: str) -> Any:
        raise ValueError(name)  # NaN, Infinity: Python-only extensions

    try:
        json.loads(data.decode("utf-8", "surrogateescape"), parse_constant=no_constants)
    except ValueError:
        return False
    return True


def check_scanner(data: bytes) -> None:
    message = gojson.syntax_error(data)
    assert (message is None) == stdlib_accepts(data), (data, message)
    prefixes = [gojson.syntax_error(data[:k]) for k in range(1, len(data) + 1)]
    if message is None or message == gojson.END_OF_INPUT:
        # No byte was invalid, so no prefix has an invalid byte either.
        assert all(m is None or m == gojson.END_OF_INPUT for m in prefixes), data
        return
    # An online scanner: the shortest prefix that has an invalid byte fails with this message,
    # and the byte it names is that prefix's last.
    k = next(k for k, m in enumerate(prefixes, 1) if m is not None and m != gojson.END_OF_INPUT)
    assert prefixes[k - 1] == message, (data, k)
    assert message.startswith(f"invalid character {gojson.quote_char(data[k - 1])} "), (data, k)


@settings(max_examples=300, deadline=None)
@given(data=near_json() | st.binary(max_size=12))
@example(data=b'"\\ud800"')  # a lone surrogate escape: both accept
@example(data=b'"\xff"')  # not UTF-8 inside a string: Go accepts, so does json on surrogateescape
@example(data=b"-")
@example(data=b"1.")
def test_scanner_accepts_what_json_accepts_and_fails_at_the_named_byte(data: bytes) -> None:
    """``syntax_error`` is None exactly when the stdlib parser accepts (depths under Python's
    recursion limit), and a reported character is the byte where a growing prefix first fails."""
    check_scanner(data)


@pytest.mark.fuzz
@settings(max_examples=10000, deadline=None)
@given(data=near_json() | st.binary(max_size=40))
def test_scanner_accepts_what_json_accepts_and_fails_at_the_named_byte_long(data: bytes) -> None:
    """The same, at length (``pytest -m fuzz``)."""
    check_scanner(data)


@settings(max_examples=150, deadline=None)
@given(data=near_json(), budget=st.integers(1, 40), max_bytes=st.integers(1, 200))
def test_limits_only_ever_give_up(data: bytes, budget: int, max_bytes: int) -> None:
    """Under a token or byte limit the answer is the unlimited one or None (gave up), never another."""
    limited = gojson.syntax_error(data, token_budget=budget, max_bytes=max_bytes)
    assert limited is None or limited == gojson.syntax_error(data)
