"""passthrough-parser: any body is forwarded untouched, with no model and no usage."""

from __future__ import annotations

from typing import cast

import pytest

from epp.parsers.api import Parser
from epp.parsers.plugins.passthrough import PassthroughParser
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"passthrough-parser", id="gie-case-6"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"model":"m","prompt":"p"}', id="json-not-parsed"),
        pytest.param(b"\xff\x00\xfe", id="binary"),
    ],
)
def test_passthrough(body: bytes) -> None:
    """The body is RAW, not decoded, forwarded as the same object; no usage parser is offered."""
    parser = PassthroughParser("passthrough-parser", NoParams(), cast(Handle, None))
    assert isinstance(parser, Parser)
    assert frozenset() == parser.APP_PROTOCOLS
    parsed = parser.parse_request(body, {":path": "/v1/completions"})
    assert parsed.api == ApiKind.RAW
    assert parsed.json is None
    assert parsed.prompt_text is None
    assert parsed.model == ""
    assert parser.serialize_request(parsed) is body
    assert parser.usage_parser({"content-type": "text/event-stream"}) is None
