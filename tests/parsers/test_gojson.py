"""Go encoding/json error texts: the scanner replay and the top-level type errors."""

from __future__ import annotations

import pytest

from epp.parsers import gojson

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
