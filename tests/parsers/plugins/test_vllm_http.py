"""vllmhttp-parser: vLLM's /inference/v1/generate (vectors from llm-d-router's vllmhttp_test.go)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins.vllm_http import VllmHttpParser
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, Usage

GENERATE = {":path": "/inference/v1/generate"}


@pytest.fixture
def parser() -> VllmHttpParser:
    return VllmHttpParser("vllmhttp-parser", NoParams(), cast(Handle, None))


def test_is_a_parser(parser: VllmHttpParser) -> None:
    assert isinstance(parser, Parser)
    assert parser.TYPE == "vllmhttp-parser"
    assert frozenset({"http", "kubernetes.io/h2c"}) == parser.APP_PROTOCOLS


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (GENERATE, {"model": "m", "token_ids": [1, 2, 3]}),
        (GENERATE, {"model": "m", "token_ids": [1, 2, 3], "cache_salt": "s"}),
        (
            GENERATE,
            {"model": "m", "token_ids": [4, 5], "sampling_params": {"max_tokens": 128, "temperature": 0.5}},
        ),
        ({"x-original-path": "/inference/v1/generate"}, {"model": "m", "token_ids": [1]}),
        (GENERATE, {"model": "m", "token_ids": [1, 2], "stream": True}),
        (
            GENERATE,
            {"token_ids": [7, 8], "features": {"mm_hashes": {"image": ["h"]}}},
        ),  # features pass through
    ],
)
def test_generate_requests(parser: VllmHttpParser, headers: dict[str, str], body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    parsed = parser.parse_request(raw, headers)
    assert parsed.api is ApiKind.GENERATE and parsed.raw == raw and parsed.json == body
    assert list(parsed.token_ids or ()) == body["token_ids"]
    assert parsed.model == body.get("model", "")
    assert parsed.cache_salt == body.get("cache_salt", "")
    assert parsed.stream is (body.get("stream") is True)


@pytest.mark.parametrize(
    ("headers", "body", "error"),
    [
        (GENERATE, b'{"model": "m"}', "must have non-empty token_ids field"),
        (GENERATE, b'{"token_ids": []}', "must have non-empty token_ids field"),
        (GENERATE, b'{"token_ids":[1,2,-1]}', r"token_ids\[2\]: invalid value"),
        (GENERATE, b'{"token_ids":[1, true]}', r"token_ids\[1\]: invalid value"),
        (GENERATE, b'{"token_ids": "1 2"}', "token_ids must be a list"),
        (GENERATE, b'{"token_ids": [1], "cache_salt": 3}', "cache_salt must be a string"),
        (GENERATE, b"[1]", "cannot unmarshal array"),
        ({":path": "/v1/completions"}, b'{"token_ids": [1]}', "unsupported path: /v1/completions"),
    ],
)
def test_invalid_requests(parser: VllmHttpParser, headers: dict[str, str], body: bytes, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        parser.parse_request(body, headers)


def test_model_rewrite_and_usage_are_openai_s(parser: VllmHttpParser) -> None:
    raw = b'{"model": "m", "token_ids": [1, 2]}'
    parsed = parser.parse_request(raw, GENERATE)
    assert parsed.json is not None
    parsed.json["model"] = "m2"
    assert parser.serialize_request(parsed) == b'{"model": "m2", "token_ids": [1, 2]}'
    up = parser.usage_parser({"content-type": "application/json"})
    assert up is not None
    usage = up.feed(
        b'{"object": "text_completion", "usage": {"prompt_tokens": 2, "completion_tokens": 3}}', True
    )
    assert usage == Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5)
