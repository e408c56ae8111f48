"""Locating the top-level model value in raw JSON bytes, soundly, without decoding the body."""

from __future__ import annotations

import orjson
import pytest

from epp.parsers.json_rewrite import model_value_span, replace_model


@pytest.mark.parametrize(
    ("raw", "current", "expected"),
    [
        pytest.param(b'{"model":"m"}', "m", b'{"model":"N"}', id="only-key"),
        pytest.param(
            b'{"a":{"model":"x"},"model":"m"}', "m", b'{"a":{"model":"x"},"model":"N"}', id="nested-other"
        ),
        pytest.param(
            b'{"a":{"model":"m"},"model":"m"}',
            "m",
            b'{"a":{"model":"m"},"model":"N"}',
            id="nested-same-value",
        ),
        pytest.param(
            b'{"a":"{\\"model\\":\\"m\\"}","model":"m"}',
            "m",
            b'{"a":"{\\"model\\":\\"m\\"}","model":"N"}',
            id="key-inside-string",
        ),
        pytest.param(
            b'{"a":"]]}}[[{{","b":{"model":"m"},"model":"m"}',
            "m",
            b'{"a":"]]}}[[{{","b":{"model":"m"},"model":"N"}',
            id="brackets-in-strings",
        ),
        pytest.param(
            b'{"\\u006dodel":"m","a":{"model":"m"}}',
            "m",
            b'{"\\u006dodel":"N","a":{"model":"m"}}',
            id="escaped-top-level-key",
        ),
        pytest.param(
            b'{"MODEL":"m","model" :\n "m\\/x"}', "m/x", b'{"MODEL":"m","model" :\n "N"}', id="escaped-value"
        ),
    ],
)
def test_replace_model(raw: bytes, current: str, expected: bytes) -> None:
    """Exactly the top-level model string literal is replaced; everything else is byte-identical."""
    assert replace_model(raw, current, "N") == expected
    span = model_value_span(raw, current)
    assert span is not None
    assert orjson.loads(raw[span[0] : span[1]]) == current


@pytest.mark.parametrize(
    ("raw", "current"),
    [
        pytest.param(b'{"model":"m","model":"m"}', "m", id="duplicate-top-level"),
        pytest.param(b'{"a":{"model":"m"},"model":"m","model":"m"}', "m", id="duplicate-with-decoy"),
        pytest.param(b'{"prompt":"p"}', "m", id="absent"),
    ],
)
def test_model_value_span_refuses(raw: bytes, current: str) -> None:
    """Ambiguous or missing keys give None, so the caller re-encodes instead of guessing."""
    assert model_value_span(raw, current) is None
