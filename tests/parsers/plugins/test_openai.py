"""openai-parser: API detection, GIE's validation messages, hostile bodies, re-serialisation."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins.openai import JsonRequestBody, OpenAIParser, api_kind, request_path
from epp.parsers.sse import SseUsageParser
from epp.parsers.usage import JsonUsageParser
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, RequestBody

CHAT = {":path": "/v1/chat/completions"}
COMPLETIONS = {":path": "/v1/completions"}
EMBEDDINGS = {":path": "/v1/embeddings"}
RESPONSES = {":path": "/v1/responses"}
CONVERSATIONS = {":path": "/v1/conversations"}
MESSAGES = {":path": "/v1/messages"}


@pytest.fixture
def parser() -> OpenAIParser:
    return OpenAIParser("openai-parser", NoParams(), cast(Handle, None))


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


def test_is_a_parser(parser: OpenAIParser) -> None:
    """The plugin satisfies the Parser protocol and declares GIE's type and app protocols."""
    assert isinstance(parser, Parser)
    assert parser.TYPE == "openai-parser"
    assert frozenset({"http", "kubernetes.io/h2c"}) == parser.APP_PROTOCOLS


@pytest.mark.parametrize(
    ("headers", "path"),
    [
        pytest.param({":path": "/v1/chat/completions"}, "/v1/chat/completions", id="pseudo-header"),
        pytest.param({":path": "/v1/responses?api-version=2"}, "/v1/responses", id="query-stripped"),
        pytest.param({"x-original-path": "/v1/embeddings"}, "/v1/embeddings", id="x-original-path"),
        pytest.param({"x-forwarded-path": "/v1/responses"}, "/v1/responses", id="x-forwarded-path"),
        pytest.param(
            {":path": "/v1/completions", "x-original-path": "/v1/embeddings"},
            "/v1/completions",
            id=":path-wins",
        ),
        pytest.param(
            {":path": "", "x-original-path": "/v1/embeddings"}, "/v1/embeddings", id="empty-path-skipped"
        ),
        pytest.param({}, "/v1/completions", id="default"),
    ],
)
def test_request_path(headers: dict[str, str], path: str) -> None:
    """The path comes from :path, then x-original-path, then x-forwarded-path, as in GIE."""
    assert request_path(headers) == path


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        pytest.param("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS, id="chat"),
        pytest.param("/openai/deployments/x/chat/completions", ApiKind.CHAT_COMPLETIONS, id="chat-prefixed"),
        pytest.param("/v1/completions", ApiKind.COMPLETIONS, id="completions"),
        pytest.param("/v1/embeddings/", ApiKind.EMBEDDINGS, id="trailing-slash"),
        pytest.param("/v1/responses", ApiKind.RESPONSES, id="responses"),
        pytest.param("/v1/conversations", ApiKind.CONVERSATIONS, id="conversations"),
        pytest.param("/v1/conversations/c1/items", ApiKind.CONVERSATIONS, id="conversation-items"),
        pytest.param("/v1/messages", ApiKind.MESSAGES, id="anthropic-messages"),
        pytest.param("/v1/messages/count_tokens", ApiKind.MESSAGES, id="anthropic-count-tokens"),
        pytest.param("/generate", ApiKind.COMPLETIONS, id="unknown-is-completions"),
    ],
)
def test_api_kind(path: str, kind: ApiKind) -> None:
    """The API is chosen by path suffix; unknown paths are completions."""
    assert api_kind(path) == kind


@pytest.mark.parametrize(
    ("headers", "obj", "api", "prompt_text", "token_ids", "stream", "salt"),
    [
        pytest.param(
            {}, {"model": "m", "prompt": "hello"}, ApiKind.COMPLETIONS, "hello", None, False, "", id="no-path"
        ),
        pytest.param(
            COMPLETIONS,
            {"model": "m", "prompt": ["a", "b"]},
            ApiKind.COMPLETIONS,
            "a b",
            None,
            False,
            "",
            id="prompt-strings-joined",
        ),
        pytest.param(
            COMPLETIONS,
            {"model": "m", "prompt": [1, 2, 3]},
            ApiKind.COMPLETIONS,
            None,
            [1, 2, 3],
            False,
            "",
            id="prompt-token-ids",
        ),
        pytest.param(
            COMPLETIONS,
            {"model": "m", "prompt": [[1, 2], [3]]},
            ApiKind.COMPLETIONS,
            None,
            [1, 2, 3],
            False,
            "",
            id="prompt-token-id-lists-flattened",
        ),
        pytest.param(
            COMPLETIONS,
            {"model": "m", "prompt": "p", "stream": True, "cache_salt": "s"},
            ApiKind.COMPLETIONS,
            "p",
            None,
            True,
            "s",
            id="stream-and-salt",
        ),
        pytest.param(
            COMPLETIONS,
            {"model": "m", "prompt": "p", "stream": None, "cache_salt": None},
            ApiKind.COMPLETIONS,
            "p",
            None,
            False,
            "",
            id="null-optionals",
        ),
        pytest.param(
            CHAT,
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            ApiKind.CHAT_COMPLETIONS,
            None,
            None,
            True,
            "",
            id="chat-string-content",
        ),
        pytest.param(
            CHAT,
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                    {"role": "tool", "content": "42", "tool_call_id": "1"},
                ],
            },
            ApiKind.CHAT_COMPLETIONS,
            None,
            None,
            False,
            "",
            id="chat-blocks-and-null-content",
        ),
        pytest.param(
            EMBEDDINGS,
            {"model": "m", "input": "text"},
            ApiKind.EMBEDDINGS,
            "text",
            None,
            False,
            "",
            id="embeddings-string",
        ),
        pytest.param(
            EMBEDDINGS,
            {"model": "m", "input": [5, 6]},
            ApiKind.EMBEDDINGS,
            None,
            [5, 6],
            False,
            "",
            id="embeddings-token-ids",
        ),
        pytest.param(
            RESPONSES,
            {"model": "m", "input": "hi", "cache_salt": "x"},
            ApiKind.RESPONSES,
            None,
            None,
            False,
            "x",
            id="responses",
        ),
        pytest.param(
            RESPONSES,
            {"model": "m", "input": [{"role": "user", "content": "hi"}]},
            ApiKind.RESPONSES,
            None,
            None,
            False,
            "",
            id="responses-items",
        ),
        pytest.param(
            CONVERSATIONS,
            {"items": [{"type": "message", "role": "user", "content": "hi"}]},
            ApiKind.CONVERSATIONS,
            None,
            None,
            False,
            "",
            id="conversations",
        ),
        pytest.param(
            MESSAGES,
            {
                "model": "claude",
                "max_tokens": 64,
                "system": "be brief",
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            ApiKind.MESSAGES,
            None,
            None,
            True,
            "",
            id="anthropic-system-string",
        ),
        pytest.param(
            MESSAGES,
            {
                "model": "claude",
                "max_tokens": 64,
                "system": [{"type": "text", "text": "be brief"}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            },
            ApiKind.MESSAGES,
            None,
            None,
            False,
            "",
            id="anthropic-system-blocks",
        ),
        pytest.param(
            {":path": "/v1/messages/count_tokens"},
            {"model": "claude", "messages": [{"role": "user", "content": "hi"}]},
            ApiKind.MESSAGES,
            None,
            None,
            False,
            "",
            id="anthropic-count-tokens-no-max-tokens",
        ),
    ],
)
def test_parse_valid(
    parser: OpenAIParser,
    headers: dict[str, str],
    obj: dict[str, Any],
    api: ApiKind,
    prompt_text: str | None,
    token_ids: list[int] | None,
    stream: bool,
    salt: str,
) -> None:
    """Each API's valid bodies parse into the RequestBody fields the scheduler reads."""
    raw = _json(obj)
    body = parser.parse_request(raw, headers)
    assert body.api == api
    assert body.raw is raw
    assert body.json == obj
    assert body.prompt_text == prompt_text
    assert (list(body.token_ids) if body.token_ids is not None else None) == token_ids
    assert body.stream is stream
    assert body.cache_salt == salt
    assert body.model == obj.get("model", "")


@pytest.mark.parametrize(
    ("headers", "raw", "message"),
    [
        # GIE's own messages (§2.7), including Go's JSON errors.
        pytest.param(
            {},
            b"no healthy upstream",
            "error unmarshaling request bodyMap: invalid character 'o' in literal null (expecting 'u')",
            id="gie-case-8-invalid-json",
        ),
        pytest.param(
            {}, b"", "error unmarshaling request bodyMap: unexpected end of JSON input", id="empty-body"
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[{"role":"user","content":"hi"}]',
            "error unmarshaling request bodyMap: unexpected end of JSON input",
            id="truncated",
        ),
        pytest.param(
            {},
            b"\xef\xbb\xbf{}",
            "error unmarshaling request bodyMap: invalid character '\u00ef' looking for beginning of value",
            id="bom",
        ),
        pytest.param(
            {},
            b"[1,2]",
            "error unmarshaling request bodyMap: json: cannot unmarshal array into Go value of type "
            "map[string]interface {}",
            id="array",
        ),
        pytest.param(
            {},
            b'"text"',
            "error unmarshaling request bodyMap: json: cannot unmarshal string into Go value of type "
            "map[string]interface {}",
            id="string",
        ),
        pytest.param(
            {},
            b"42",
            "error unmarshaling request bodyMap: json: cannot unmarshal number into Go value of type "
            "map[string]interface {}",
            id="number",
        ),
        pytest.param(
            CHAT, b"null", "invalid chat completions request: must have valid messages field", id="null"
        ),
        pytest.param(
            CHAT,
            b'{"model":"m"}',
            "invalid chat completions request: must have valid messages field",
            id="chat-no-messages",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[]}',
            "invalid chat completions request: must have valid messages field",
            id="chat-empty-messages",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":"hi"}',
            "invalid chat completions request: must have valid messages field",
            id="chat-messages-not-list",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":["hi"]}',
            "invalid chat completions request: must have valid messages field",
            id="chat-message-not-object",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[{"role":"user","content":5}]}',
            "invalid chat completions request: must have valid messages field",
            id="chat-content-number",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[{"role":"user","content":["hi"]}]}',
            "invalid chat completions request: must have valid messages field",
            id="chat-block-not-object",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[{"role":1,"content":"x"}]}',
            "invalid chat completions request: must have valid messages field",
            id="chat-role-number",
        ),
        pytest.param(
            {}, b'{"prompt":""}', "invalid completions request: must have prompt field", id="prompt-empty"
        ),
        pytest.param(
            {},
            b'{"prompt":[]}',
            "invalid completions request: must have prompt field",
            id="prompt-empty-list",
        ),
        pytest.param(
            {}, b'{"model":"m"}', "invalid completions request: must have prompt field", id="no-prompt"
        ),
        pytest.param(
            {},
            b'{"prompt":["a",1]}',
            "invalid completions request: must have prompt field",
            id="prompt-mixed",
        ),
        pytest.param(
            {},
            b'{"prompt":[1,-2]}',
            "invalid completions request: must have prompt field",
            id="prompt-negative-id",
        ),
        pytest.param(
            {},
            b'{"prompt":[1.5]}',
            "invalid completions request: must have prompt field",
            id="prompt-float-id",
        ),
        pytest.param(
            {},
            b'{"prompt":[4294967296]}',
            "invalid completions request: must have prompt field",
            id="prompt-id-over-uint32",
        ),
        pytest.param(
            {},
            b'{"prompt":[true]}',
            "invalid completions request: must have prompt field",
            id="prompt-bool-id",
        ),
        pytest.param(
            {},
            b'{"prompt":[[1],[]]}',
            "invalid completions request: must have prompt field",
            id="prompt-empty-inner-list",
        ),
        pytest.param(
            {},
            b'{"prompt":{"text":"x"}}',
            "invalid completions request: must have prompt field",
            id="prompt-object",
        ),
        pytest.param(
            RESPONSES,
            b'{"model":"m"}',
            "invalid responses request: must have input field",
            id="responses-no-input",
        ),
        pytest.param(
            RESPONSES,
            b'{"model":"m","input":null}',
            "invalid responses request: must have input field",
            id="responses-null-input",
        ),
        pytest.param(
            CONVERSATIONS,
            b'{"items":[]}',
            "invalid conversations request: must have items field",
            id="conversations-empty",
        ),
        pytest.param(
            CONVERSATIONS,
            b'{"items":"x"}',
            "invalid conversations request: must have items field",
            id="conversations-not-list",
        ),
        pytest.param(
            EMBEDDINGS,
            b'{"model":"m"}',
            "invalid embeddings request: must have input field",
            id="embeddings-no-input",
        ),
        pytest.param(
            EMBEDDINGS,
            b'{"model":"m","input":""}',
            "invalid embeddings request: must have input field",
            id="embeddings-empty-input",
        ),
        # Anthropic /v1/messages, analogous to chat.
        pytest.param(
            MESSAGES,
            b'{"model":"c","max_tokens":8,"messages":[]}',
            "invalid messages request: must have valid messages field",
            id="messages-empty",
        ),
        pytest.param(
            MESSAGES,
            b'{"model":"c","messages":[{"role":"user","content":"hi"}]}',
            "invalid messages request: must have max_tokens field",
            id="messages-no-max-tokens",
        ),
        pytest.param(
            MESSAGES,
            b'{"model":"c","max_tokens":"8","messages":[{"role":"user","content":"hi"}]}',
            "invalid messages request: max_tokens must be an integer",
            id="messages-max-tokens-string",
        ),
        pytest.param(
            MESSAGES,
            b'{"model":"c","max_tokens":8,"system":5,"messages":[{"role":"user","content":"x"}]}',
            "invalid messages request: system must be a string or a list of content blocks",
            id="messages-system-number",
        ),
        # Wrong types of the fields every API shares.
        pytest.param(
            {},
            b'{"model":5,"prompt":"x"}',
            "invalid completions request: model must be a string",
            id="model-number",
        ),
        pytest.param(
            CHAT,
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}',
            "invalid chat completions request: stream must be a boolean",
            id="stream-string",
        ),
        pytest.param(
            RESPONSES,
            b'{"model":"m","input":"x","cache_salt":1}',
            "invalid responses request: cache_salt must be a string",
            id="cache-salt-number",
        ),
        # Bodies Go would accept but we refuse: not UTF-8, or nested beyond orjson's 1024 levels.
        pytest.param(
            {},
            b'{"prompt":"\xff\xfe"}',
            "error unmarshaling request bodyMap: invalid UTF-8 in JSON input",
            id="invalid-utf8",
        ),
        pytest.param(
            {},
            b'{"prompt":"\\ud800"}',
            "error unmarshaling request bodyMap: no low surrogate in string",
            id="lone-surrogate-escape",
        ),
        pytest.param(
            {},
            b'{"prompt":"x","a":' + b"[" * 1100 + b"]" * 1100 + b"}",
            "error unmarshaling request bodyMap: exceeded max depth",
            id="nested-depth",
        ),
    ],
)
def test_parse_invalid(parser: OpenAIParser, headers: dict[str, str], raw: bytes, message: str) -> None:
    """Invalid bodies raise BadRequest with GIE's message (or a precise one naming the field)."""
    with pytest.raises(BadRequest) as info:
        parser.parse_request(raw, headers)
    assert info.value.msg == message
    assert str(info.value) == f"inference error: BadRequest - {message}"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"prompt":"hello world"}', id="gie-case-4-missing"),
        pytest.param(b'{"prompt":"x","model":null}', id="null"),
    ],
)
def test_missing_model_is_left_to_the_director(parser: OpenAIParser, raw: bytes) -> None:
    """A body without a model parses; body.model is "" so the director answers 'model not found'."""
    assert parser.parse_request(raw, {}).model == ""


def test_ten_megabyte_prompt(parser: OpenAIParser) -> None:
    """A 10 MB prompt parses in bounded time and the prompt text is not copied or re-joined."""
    prompt = "word " * 2_000_000
    raw = _json({"model": "m", "prompt": prompt})
    started = time.perf_counter()
    body = parser.parse_request(raw, COMPLETIONS)
    assert time.perf_counter() - started < 5.0
    assert body.prompt_text == prompt
    assert body.json is not None
    assert body.prompt_text is body.json["prompt"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            b"[" + b"1," * 5_000_000 + b"x]", "unexpected character, expected a JSON value", id="late-error"
        ),
        pytest.param(
            b'{"prompt":"' + b"ab\\ncd" * 2_000_000, "unexpected end of JSON input", id="truncated-string"
        ),
    ],
)
def test_ten_megabyte_invalid_body_fails_fast(parser: OpenAIParser, raw: bytes, message: str) -> None:
    """A huge invalid body is refused without replaying Go's scanner over all of it."""
    started = time.perf_counter()
    with pytest.raises(BadRequest) as info:
        parser.parse_request(raw, COMPLETIONS)
    assert time.perf_counter() - started < 5.0
    assert info.value.msg == "error unmarshaling request bodyMap: " + message


# ---- serialize_request ----------------------------------------------------------------------


def _parse(parser: OpenAIParser, raw: bytes, headers: Mapping[str, str] = CHAT) -> RequestBody:
    return parser.parse_request(raw, headers)


CHAT_WITH_NESTED = (
    b'{"messages":[{"role":"user","content":"say \\"model\\": x","model":"inner"}],\n'
    b'  "model" : "llama",\n  "tools":[{"type":"function","function":{"parameters":'
    b'{"properties":{"model":{"type":"string"}}}}}],"metadata":{"model":"llama"},"temperature":0.10}'
)


@pytest.mark.parametrize(
    ("raw", "target", "expected"),
    [
        pytest.param(
            b'{"max_tokens":100,"model":"my-model","prompt":"test1","temperature":0}',
            "my-model-12345",
            b'{"max_tokens":100,"model":"my-model-12345","prompt":"test1","temperature":0}',
            id="gie-case-1",
        ),
        pytest.param(
            b'{"max_tokens":100,"model":"sql-lora-sheddable","prompt":"test6","temperature":0}',
            "sql-lora-1fdg3",
            b'{"max_tokens":100,"model":"sql-lora-1fdg3","prompt":"test6","temperature":0}',
            id="gie-case-9",
        ),
    ],
)
def test_serialize_matches_gie_forwarded_body(
    parser: OpenAIParser, raw: bytes, target: str, expected: bytes
) -> None:
    """For GIE's test bodies (already sorted and compact) the forwarded bytes equal Go's re-encoding."""
    body = _parse(parser, raw, COMPLETIONS)
    assert body.json is not None
    body.json["model"] = target
    assert parser.serialize_request(body) == expected


def test_serialize_unchanged_is_zero_copy(parser: OpenAIParser) -> None:
    """When the model was not changed the original bytes object is returned as-is."""
    body = _parse(parser, CHAT_WITH_NESTED)
    assert parser.serialize_request(body) is CHAT_WITH_NESTED


def test_serialize_same_model_is_zero_copy(parser: OpenAIParser) -> None:
    """Setting the model to the value it already had keeps the original bytes."""
    body = _parse(parser, CHAT_WITH_NESTED)
    assert body.json is not None
    body.json["model"] = "llama"
    assert parser.serialize_request(body) is CHAT_WITH_NESTED


@pytest.mark.parametrize(
    "new_model",
    [
        pytest.param("llama-lora-1", id="plain"),
        pytest.param('we"ird\\name', id="quote-and-backslash"),
        pytest.param("mod\u00e8le-\u6a21\u578b-\U0001f999", id="unicode"),
        pytest.param("tab\there\nnl\x01", id="control-chars"),
        pytest.param("", id="empty"),
    ],
)
def test_serialize_splices_only_top_level_model(parser: OpenAIParser, new_model: str) -> None:
    """Only the top-level model value changes; nested "model" keys and every other byte are kept."""
    body = _parse(parser, CHAT_WITH_NESTED)
    assert body.json is not None
    expected = dict(body.json, model=new_model)
    body.json["model"] = new_model
    out = parser.serialize_request(body)
    assert orjson.loads(out) == expected
    old = b'"llama",\n  "tools"'
    start = CHAT_WITH_NESTED.index(old)
    assert (
        out
        == CHAT_WITH_NESTED[:start] + orjson.dumps(new_model) + CHAT_WITH_NESTED[start + len(b'"llama"') :]
    )


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"model":"a","prompt":"p"}', id="first"),
        pytest.param(b'{"prompt":"p","model":"a"}', id="last"),
        pytest.param(b'{\n  "prompt": "p",\n  "model"\t:\r\n "a" ,\n  "n": 1\n}\n', id="pretty-printed"),
        pytest.param(b'{"prompt":"p","model":"a\\u0062c"}', id="escaped-value"),
        pytest.param(b'{"mod\\u0065l":"a","prompt":"p","x":{"model":"a"}}', id="escaped-key-nested-decoy"),
        pytest.param(
            b'{"x":{"model":"a"},"y":[{"model":"a"}],"model":"a","prompt":"p"}', id="same-value-decoys"
        ),
        pytest.param(b'{"x":"\\"model\\":\\"a\\"","model":"a","prompt":"p"}', id="key-text-inside-string"),
        pytest.param(b'{"x":"\\\\","model":"a","prompt":"p"}', id="escaped-backslash-before-key"),
    ],
)
def test_serialize_finds_top_level_model(parser: OpenAIParser, raw: bytes) -> None:
    """The top-level key is found whatever the layout, escapes and same-valued nested decoys."""
    body = _parse(parser, raw, COMPLETIONS)
    assert body.json is not None
    expected = dict(body.json, model="b")
    body.json["model"] = "b"
    out = parser.serialize_request(body)
    assert orjson.loads(out) == expected
    assert len(out) != len(raw) or out != raw


def test_serialize_duplicate_top_level_model_reencodes(parser: OpenAIParser) -> None:
    """With the key twice at the top level the object is re-encoded, leaving one model."""
    raw = b'{"model":"a","prompt":"p","model":"a"}'
    body = _parse(parser, raw, COMPLETIONS)
    assert body.json is not None
    body.json["model"] = "b"
    assert parser.serialize_request(body) == b'{"model":"b","prompt":"p"}'


def test_serialize_replaced_json_is_reencoded(parser: OpenAIParser) -> None:
    """A director that replaces body.json wholesale gets the new object encoded."""
    body = _parse(parser, b'{"model":"a","prompt":"p"}', COMPLETIONS)
    body.json = {"model": "b", "prompt": "q"}
    assert parser.serialize_request(body) == b'{"model":"b","prompt":"q"}'


def test_serialize_removed_model_is_reencoded(parser: OpenAIParser) -> None:
    """Deleting the model key cannot be spliced, so the object is re-encoded."""
    body = _parse(parser, b'{"model":"a","prompt":"p"}', COMPLETIONS)
    assert body.json is not None
    del body.json["model"]
    assert parser.serialize_request(body) == b'{"prompt":"p"}'


def test_serialize_plain_request_body(parser: OpenAIParser) -> None:
    """A RequestBody not built by this parser is re-encoded from its json, or sent raw without one."""
    plain = RequestBody(api=ApiKind.COMPLETIONS, raw=b'{"model":"a"}', json={"model": "b"})
    assert parser.serialize_request(plain) == b'{"model":"b"}'
    raw_only = RequestBody(api=ApiKind.RAW, raw=b"opaque")
    assert parser.serialize_request(raw_only) is raw_only.raw


_KEYS = st.sampled_from(["model", "messages", "content", "x", "mod\u00e8l", '"q"', "a\\b"])
_LEAVES = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(
    members=st.lists(
        st.tuples(_KEYS.filter(lambda k: k != "model"), _VALUES), max_size=5, unique_by=lambda m: m[0]
    ),
    old=st.text(max_size=10),
    new=st.text(max_size=10),
    position=st.integers(0, 5),
    colon=st.sampled_from([b":", b" : ", b":\n  ", b"\t:\r\n"]),
)
def test_serialize_splice_property(
    members: list[tuple[str, Any]], old: str, new: str, position: int, colon: bytes
) -> None:
    """For any object with nested "model" keys, exactly the top-level value's bytes are replaced."""
    parser = OpenAIParser("openai-parser", NoParams(), cast(Handle, None))
    members.append(("prompt", "p"))
    position = min(position, len(members))
    members.insert(position, ("model", old))
    head = b"{" + b"".join(orjson.dumps(k) + b":" + orjson.dumps(v) + b"," for k, v in members[:position])
    head += b'"model"' + colon
    tail = (
        b"".join(b"," + orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in members[position + 1 :]) + b"}"
    )
    raw = head + orjson.dumps(old) + tail
    body = parser.parse_request(raw, COMPLETIONS)
    assert body.json is not None
    body.json["model"] = new
    out = parser.serialize_request(body)
    assert out == (raw if old == new else head + orjson.dumps(new) + tail)
    assert orjson.loads(out) == dict(members, model=new)


# ---- usage_parser selection -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "kind"),
    [
        pytest.param({"content-type": "text/event-stream"}, SseUsageParser, id="sse"),
        pytest.param({"content-type": "text/event-stream; charset=utf-8"}, SseUsageParser, id="sse-charset"),
        pytest.param({"content-type": "Text/Event-Stream"}, SseUsageParser, id="sse-case"),
        pytest.param({"content-type": "application/json"}, JsonUsageParser, id="json"),
        pytest.param({}, JsonUsageParser, id="no-content-type"),
    ],
)
def test_usage_parser_choice(parser: OpenAIParser, headers: dict[str, str], kind: type) -> None:
    """Streaming responses get the SSE parser, everything else the buffering JSON parser."""
    assert isinstance(parser.usage_parser(headers), kind)


def test_usage_parsers_are_fresh(parser: OpenAIParser) -> None:
    """Each response gets its own usage parser state."""
    headers = {"content-type": "text/event-stream"}
    assert parser.usage_parser(headers) is not parser.usage_parser(headers)


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        (
            "/v1/chat/completions/render",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "chat",
        ),
        ("/v1/completions/render", {"model": "m", "prompt": "x"}, "completions"),
    ],
)
def test_render_paths_take_their_parents_body(path: str, body: dict[str, object], api: str) -> None:
    """llm-d-router's determineAPITypeFromPath: /render shares the parent's schema."""
    parsed = OpenAIParser("openai-parser", NoParams(), cast(Handle, None)).parse_request(
        orjson.dumps(body), {":path": path}
    )
    assert parsed.api is (ApiKind.CHAT_COMPLETIONS if api == "chat" else ApiKind.COMPLETIONS)


def test_parsed_body_equals_the_keyword_constructor() -> None:
    """``JsonRequestBody.parsed`` sets every field (an unset slot would raise here) to what the
    keyword constructor gives for the same arguments."""
    obj: dict[str, Any] = {"model": "m", "prompt": "hi"}
    fast = JsonRequestBody.parsed(ApiKind.COMPLETIONS, b"{}", obj, "hi", [1, 2], True, "salt", "m")
    slow = JsonRequestBody(
        api=ApiKind.COMPLETIONS,
        raw=b"{}",
        json=obj,
        prompt_text="hi",
        token_ids=[1, 2],
        stream=True,
        cache_salt="salt",
        parsed_json=obj,
        parsed_model="m",
    )
    assert [getattr(fast, f.name) for f in dataclasses.fields(JsonRequestBody)] == [
        getattr(slow, f.name) for f in dataclasses.fields(JsonRequestBody)
    ]
    assert fast == slow
    assert fast.json is fast.parsed_json
