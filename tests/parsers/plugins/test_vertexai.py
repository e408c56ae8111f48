"""vertexai-parser: Vertex AI gRPC calls wrapping OpenAI JSON (vectors from llm-d-router's
vertexai_test.go).  The messages are built with protobuf from googleapis' field numbers
(``HttpBody``: content_type 1, data 2; the three requests: endpoint 1, http_body 2)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins.vertexai import HttpBodyUsageParser, VertexAIParser, length_delimited
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, Usage

F = descriptor_pb2.FieldDescriptorProto
SERVICE = "/google.cloud.aiplatform.v1beta1.PredictionService/"


def _classes() -> dict[str, Any]:  # generated classes: fields are keyword arguments
    fdp = descriptor_pb2.FileDescriptorProto(name="vertex_test.proto", package="t", syntax="proto3")
    body = fdp.message_type.add(name="HttpBody")
    body.field.add(name="content_type", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    body.field.add(name="data", number=2, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    for name in ("ChatCompletionsRequest", "StreamRawPredictRequest", "RawPredictRequest"):
        msg = fdp.message_type.add(name=name)
        msg.field.add(name="endpoint", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        msg.field.add(
            name="http_body", number=2, type=F.TYPE_MESSAGE, type_name=".t.HttpBody", label=F.LABEL_OPTIONAL
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    names = ("HttpBody", "ChatCompletionsRequest", "StreamRawPredictRequest", "RawPredictRequest")
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"t.{n}")) for n in names}


PB = _classes()


def frame(message: Message) -> bytes:
    payload = message.SerializeToString()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def request(kind: str, data: bytes, **fields: Any) -> bytes:
    return frame(PB[kind](http_body=PB["HttpBody"](content_type="application/json", data=data), **fields))


@pytest.fixture
def parser() -> VertexAIParser:
    return VertexAIParser("vertexai-parser", NoParams(), cast(Handle, None))


def test_is_a_parser(parser: VertexAIParser) -> None:
    assert isinstance(parser, Parser)
    assert parser.TYPE == "vertexai-parser"
    assert frozenset({"kubernetes.io/h2c"}) == parser.APP_PROTOCOLS


@pytest.mark.parametrize(
    ("method", "kind", "data", "api"),
    [
        (
            "ChatCompletions",
            "ChatCompletionsRequest",
            b'{"messages":[{"role":"user","content":"Hello"}],"stream":true}',
            ApiKind.CHAT_COMPLETIONS,
        ),
        (
            "StreamRawPredict",
            "StreamRawPredictRequest",
            b'{"input":"Hello from stream raw predict"}',
            ApiKind.RESPONSES,
        ),
        ("RawPredict", "RawPredictRequest", b'{"input":"Hello from raw predict"}', ApiKind.RESPONSES),
    ],
)
def test_wrapped_json_is_parsed_as_openai(
    parser: VertexAIParser, method: str, kind: str, data: bytes, api: ApiKind
) -> None:
    body = request(kind, data, endpoint="projects/p/locations/l/endpoints/e")
    parsed = parser.parse_request(body, {":path": SERVICE + method, "content-type": "application/grpc"})
    assert parsed.api is api and parsed.raw == body
    assert parsed.json is not None and parsed.json == orjson.loads(data)
    assert parsed.stream is (b'"stream":true' in data)
    assert parser.serialize_request(parsed) == body  # the gRPC call goes upstream as received


def test_unknown_method_is_forwarded_unparsed(parser: VertexAIParser) -> None:
    parsed = parser.parse_request(b"", {":path": "/unsupported/path"})
    assert parsed.api is ApiKind.RAW and parsed.raw == b"" and parsed.json is None


@pytest.mark.parametrize(
    ("method", "body", "error"),
    [
        (
            "ChatCompletions",
            b"\x00\x00\x00\x00",
            "invalid gRPC frame: expected at least 5 bytes for header, got 4",
        ),
        ("ChatCompletions", b"\x00\x00\x00\x00\x01\xff", "unmarshaling ChatCompletionsRequest"),
        ("StreamRawPredict", b"\x00\x00\x00\x00\x01\xff", "unmarshaling StreamRawPredictRequest"),
        ("RawPredict", b"\x00\x00\x00\x00\x01\xff", "unmarshaling RawPredictRequest"),
        ("ChatCompletions", b"\x01\x00\x00\x00\x00", "compressed gRPC payload is not supported"),
        ("ChatCompletions", b"\x00\x00\x00\x00\x09ab", "incomplete gRPC payload: header indicates 9 bytes"),
        (
            "ChatCompletions",
            frame(PB["ChatCompletionsRequest"](endpoint="e")),
            "ChatCompletionsRequest has no HttpBody",
        ),
        (
            "ChatCompletions",
            request("ChatCompletionsRequest", b'{"messages":[]}'),
            "parsing ChatCompletionsRequest: ",
        ),
    ],
)
def test_errors(parser: VertexAIParser, method: str, body: bytes, error: str) -> None:
    with pytest.raises(BadRequest, match=error):
        parser.parse_request(body, {":path": SERVICE + method})


def test_wire_reader_skips_other_fields_and_takes_the_last() -> None:
    msg = PB["HttpBody"](content_type="x", data=b"first").SerializeToString()
    msg += PB["HttpBody"](data=b"last").SerializeToString()  # protobuf: the last one wins
    assert length_delimited(msg, 2) == b"last"
    assert length_delimited(msg, 1) == b"x"
    assert length_delimited(b"\x08\x96\x01", 2) is None  # a varint field only
    with pytest.raises(ValueError, match="wire-format"):
        length_delimited(b"\x12\x05ab", 2)  # length past the end


def response(data: bytes) -> bytes:
    return frame(PB["HttpBody"](content_type="application/json", data=data))


USAGE = b'{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'


def test_response_usage_from_http_body_frames_split_anywhere() -> None:
    body = response(b'{"object":"chat.completion","choices":[]}') + response(USAGE)
    for cut in range(len(body) + 1):
        up = HttpBodyUsageParser()
        up.feed(body[:cut], False)
        assert up.feed(body[cut:], True) == Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)


def test_streamed_events_in_frames_and_no_usage() -> None:
    up = HttpBodyUsageParser()
    event = b'data: {"object":"chat.completion.chunk","usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
    assert up.feed(response(b'data: {"choices":[]}\n\n') + response(event), False) == Usage(
        prompt_tokens=5, completion_tokens=1, total_tokens=6
    )
    assert HttpBodyUsageParser().feed(b"", True) is None
    assert HttpBodyUsageParser().feed(b"\x00\x00\x00\x00\x01\xff", True) is None  # bad proto: no usage
