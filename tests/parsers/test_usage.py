"""Usage field mapping by response object type, and the buffering non-streamed usage parser."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.parsers.usage import JsonUsageParser, usage_of_response
from epp.request import Usage


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {
                "object": "chat.completion",
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": 10,
                    "total_tokens": 17,
                    "input_tokens": 99,
                },
            },
            Usage(7, 10, 17),
            id="chat-completion-ignores-input-names",
        ),
        pytest.param(
            {
                "object": "text_completion",
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            },
            Usage(3, 4, 7),
            id="text-completion",
        ),
        pytest.param(
            {"object": "chat.completion.chunk", "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
            Usage(1, 1, 2),
            id="chunk-total-computed-when-absent",
        ),
        pytest.param(
            {
                "object": "response",
                "usage": {
                    "input_tokens": 31,
                    "output_tokens": 12,
                    "total_tokens": 43,
                    "prompt_tokens": 99,
                    "input_tokens_details": {"cached_tokens": 16},
                },
            },
            Usage(31, 12, 43, 16),
            id="responses-api",
        ),
        pytest.param(
            {"object": "conversation", "usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}},
            Usage(5, 6, 11),
            id="conversation",
        ),
        pytest.param(
            {"object": "embedding.list", "usage": {"prompt_tokens": 8, "total_tokens": 8}},
            Usage(8, 0, 8),
            id="unknown-object-prompt-fallback",
        ),
        pytest.param(
            {"usage": {"input_tokens": 2, "prompt_tokens": 9, "output_tokens": 3, "completion_tokens": 9}},
            Usage(2, 3, 5),
            id="no-object-prefers-input-names",
        ),
        pytest.param(
            {
                "object": "chat.completion",
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 4},
                },
            },
            Usage(7, 1, 8, 4),
            id="openai-prompt-tokens-details",
        ),
        pytest.param(
            {
                "object": "chat.completion",
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": 1,
                    "prompt_token_details": {"cached_tokens": 2},
                },
            },
            Usage(7, 1, 8, 2),
            id="gie-prompt-token-details",
        ),
        pytest.param(
            {
                "object": "chat.completion",
                "usage": {"prompt_tokens": 7, "completion_tokens": 1, "prompt_tokens_details": None},
            },
            Usage(7, 1, 8, None),
            id="null-details",
        ),
        pytest.param(
            {
                "type": "message",
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 5,
                    "cache_read_input_tokens": 20,
                    "cache_creation_input_tokens": 3,
                },
            },
            Usage(33, 5, 38, 20),
            id="anthropic-message",
        ),
        pytest.param(
            {
                "object": "chat.completion",
                "usage": {"prompt_tokens": True, "completion_tokens": "9", "total_tokens": 7.0},
            },
            Usage(0, 0, 7),
            id="non-numbers-ignored",
        ),
        pytest.param({"object": "chat.completion", "usage": None}, None, id="usage-null"),
        pytest.param({"object": "chat.completion", "usage": [1]}, None, id="usage-not-object"),
        pytest.param({"object": "chat.completion"}, None, id="no-usage"),
    ],
)
def test_usage_of_response(body: dict[str, Any], expected: Usage | None) -> None:
    """Field names follow the object type as in GIE; cached tokens come from any details spelling."""
    assert usage_of_response(body) == expected


CHAT_RESPONSE = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17},
    }
)


def test_buffered_until_end_of_stream() -> None:
    """Usage is reported only once the whole body arrived, whatever the chunking (GIE case 16)."""
    parser = JsonUsageParser()
    pieces = [CHAT_RESPONSE[i : i + 10] for i in range(0, len(CHAT_RESPONSE), 10)]
    assert [parser.feed(p, False) for p in pieces] == [None] * len(pieces)
    assert parser.feed(b"", True) == Usage(7, 10, 17)
    assert parser.feed(b"", True) == Usage(7, 10, 17)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"no healthy upstream", id="gie-case-17-not-json"),
        pytest.param(b'{"usage":', id="truncated"),
        pytest.param(b'["usage"]', id="not-an-object"),
        pytest.param(b"", id="empty"),
    ],
)
def test_unparsable_bodies_have_no_usage(body: bytes) -> None:
    """Bodies that are not a JSON object yield no usage and no error."""
    assert JsonUsageParser().feed(body, True) is None


def test_oversized_body_gives_up() -> None:
    """Past the cap the buffer is dropped and usage stays unknown, even if the rest would parse."""
    parser = JsonUsageParser(max_bytes=len(CHAT_RESPONSE) - 1)
    assert parser.feed(CHAT_RESPONSE[:20], False) is None
    assert parser.feed(CHAT_RESPONSE[20:], False) is None
    assert parser._parts == []
    assert parser.feed(b"", True) is None
