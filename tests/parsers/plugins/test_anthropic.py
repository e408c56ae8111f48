"""anthropic-parser: llm-d-router's Messages-only parser (vectors from its anthropic_test.go)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins.anthropic import AnthropicParser
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, Usage

MESSAGES = {":path": "/v1/messages"}
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def parser() -> AnthropicParser:
    return AnthropicParser("anthropic-parser", NoParams(), cast(Handle, None))


def test_is_a_parser(parser: AnthropicParser) -> None:
    assert isinstance(parser, Parser)
    assert parser.TYPE == "anthropic-parser"
    assert frozenset({"http", "kubernetes.io/h2c"}) == parser.APP_PROTOCOLS


# upstream's TestAnthropicParser_ParseRequest valid cases: (headers, body)
VALID: list[tuple[dict[str, str], dict[str, Any]]] = [
    (MESSAGES, {"model": "claude", "max_tokens": 1024, "messages": HELLO}),
    (
        MESSAGES,
        {
            "model": "claude",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}],
        },
    ),
    (MESSAGES, {"model": "claude", "system": "You are helpful.", "messages": HELLO}),
    (MESSAGES, {"model": "claude", "system": [{"type": "text", "text": "Be brief."}], "messages": HELLO}),
    (
        MESSAGES,
        {
            "model": "claude",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                        },
                        {"type": "text", "text": "Describe"},
                    ],
                }
            ],
        },
    ),
    (
        MESSAGES,
        {
            "model": "claude",
            "messages": HELLO,
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        },
    ),
    (MESSAGES, {"model": "claude", "messages": HELLO, "stream": True}),
    (MESSAGES, {"model": "claude", "messages": HELLO, "cache_salt": "salt-1"}),
    ({"x-original-path": "/v1/messages"}, {"model": "claude", "messages": HELLO}),
]


@pytest.mark.parametrize(("headers", "body"), VALID)
def test_valid_messages_requests(
    parser: AnthropicParser, headers: dict[str, str], body: dict[str, Any]
) -> None:
    raw = orjson.dumps(body)
    parsed = parser.parse_request(raw, headers)
    assert parsed.api is ApiKind.MESSAGES and parsed.raw == raw
    assert parsed.json == body and parsed.model == "claude"
    assert parsed.stream is (body.get("stream") is True)
    assert parsed.cache_salt == body.get("cache_salt", "")


@pytest.mark.parametrize(
    ("headers", "body", "error"),
    [
        (MESSAGES, b'{"model": "claude", "messages": []}', "must have at least one message"),
        (MESSAGES, b'{"model": "claude"}', "must have at least one message"),
        (MESSAGES, b"null", "must have at least one message"),
        (MESSAGES, b"{malformed", "error unmarshaling request body: "),
        (MESSAGES, b'{"messages": [{"role": 1, "content": "x"}]}', "error parsing messages request: "),
        (MESSAGES, b'{"messages": "hi"}', "error parsing messages request: "),
        (MESSAGES, b'{"messages": [{"role": "user", "content": "x"}], "system": 5}', "system must be"),
        (
            MESSAGES,
            b'{"messages": [{"role": "user", "content": "x"}], "cache_salt": 5}',
            "cache_salt must be",
        ),
        (
            {":path": "/v1/chat/completions"},
            b'{"messages": [{"role": "user", "content": "x"}]}',
            "unsupported API endpoint: /v1/chat/completions",
        ),
        ({}, b'{"messages": [{"role": "user", "content": "x"}]}', "unsupported API endpoint"),
    ],
)
def test_invalid_requests(parser: AnthropicParser, headers: dict[str, str], body: bytes, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        parser.parse_request(body, headers)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"test-model","system":"You are a helpful assistant.","messages":[{"role":"user","content":"Hello"}]}',
        b"",
        b"not-json",
    ],
)
def test_count_tokens_is_forwarded_unparsed(parser: AnthropicParser, body: bytes) -> None:
    parsed = parser.parse_request(body, {":path": "/v1/messages/count_tokens"})
    assert parsed.api is ApiKind.RAW and parsed.raw == body and parsed.json is None
    assert parser.serialize_request(parsed) == body


def test_max_tokens_not_required_unlike_openai_parser(parser: AnthropicParser) -> None:
    assert parser.parse_request(orjson.dumps({"messages": HELLO}), MESSAGES).json == {"messages": HELLO}


def test_model_rewrite_splices_the_original_bytes(parser: AnthropicParser) -> None:
    raw = b'{"model": "claude",  "messages": [{"role": "user", "content": "Hello"}]}'
    parsed = parser.parse_request(raw, MESSAGES)
    assert parsed.json is not None
    parsed.json["model"] = "claude-v2"
    assert parser.serialize_request(parsed) == raw.replace(b'"claude"', b'"claude-v2"')


def _usage(parser: AnthropicParser, body: bytes, headers: dict[str, str]) -> Usage | None:
    up = parser.usage_parser(headers)
    assert up is not None
    return up.feed(body, True)


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (
            b'{"id": "msg_123", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hello"}], "usage": {"input_tokens": 25, "output_tokens": 15}}',
            Usage(prompt_tokens=25, completion_tokens=15, total_tokens=40),
        ),
        (b'{"id": "msg_123", "type": "message"}', None),
        (b"{malformed", None),  # upstream: an error; here no usage either way
        (b"", None),
        # Cache reads: upstream's prompt is input_tokens (100); here input + cache reads (docstring).
        (
            b'{"id": "msg_123", "type": "message", "usage": {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 80}}',
            Usage(prompt_tokens=180, completion_tokens=50, total_tokens=230, cached_tokens=80),
        ),
    ],
)
def test_response_usage(parser: AnthropicParser, body: bytes, want: Usage | None) -> None:
    assert _usage(parser, body, {"content-type": "application/json"}) == want


SSE = {"content-type": "text/event-stream"}


@pytest.mark.parametrize(
    ("chunk", "want"),
    [
        (
            b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_123","usage":{"input_tokens":25}}}',
            Usage(prompt_tokens=25, total_tokens=25),
        ),
        (
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}',
            Usage(completion_tokens=15, total_tokens=15),
        ),
        (
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":25}}}\n\n'
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hello"}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":15}}',
            Usage(prompt_tokens=25, completion_tokens=15, total_tokens=40),
        ),
        (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hello"}}',
            None,
        ),
        (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"usage"}}',
            None,
        ),
        (b'event: message_stop\ndata: {"type":"message_stop"}', None),
    ],
)
def test_streamed_usage(parser: AnthropicParser, chunk: bytes, want: Usage | None) -> None:
    assert _usage(parser, chunk, SSE) == want
