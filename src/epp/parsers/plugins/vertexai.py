"""``vertexai-parser`` (llm-d-router): Vertex AI's gRPC prediction calls wrapping OpenAI JSON.

Vertex AI's ``PredictionService`` carries an OpenAI-compatible JSON body inside a protobuf
``google.api.HttpBody`` (field 2 of ``ChatCompletionsRequest``, ``RawPredictRequest`` and
``StreamRawPredictRequest``).  The parser unwraps it and hands the JSON to the OpenAI parser,
as upstream does, so routing sees the prompt; the gRPC body is forwarded untouched.  The three
messages and ``HttpBody`` are read with a small wire-format reader (two length-delimited
fields), not Google's generated ``aiplatform`` package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

import orjson

from epp.errors import BadRequest
from epp.parsers.api import UsageParser
from epp.parsers.plugins.openai import OpenAIParser
from epp.parsers.plugins.vllm_grpc import FRAME_HEADER, MAX_RESPONSE_FRAME_BYTES
from epp.parsers.sse import SseUsageParser
from epp.parsers.usage import usage_of_response
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.request import ApiKind, RequestBody, Usage

# gRPC method suffix -> (the request message, for errors; the OpenAI path its JSON is parsed as)
METHODS: Final = (
    ("PredictionService/ChatCompletions", "ChatCompletionsRequest", "/chat/completions"),
    ("PredictionService/StreamRawPredict", "StreamRawPredictRequest", "/responses"),
    ("PredictionService/RawPredict", "RawPredictRequest", "/responses"),
)
HTTP_BODY_FIELD: Final = 2  # the requests' ``http_body``
DATA_FIELD: Final = 2  # ``HttpBody.data``
_WIRE: Final = "proto: cannot parse invalid wire-format data"


def grpc_payload(body: bytes) -> bytes:
    """The message of the first gRPC frame, with upstream's ``ParseGrpcPayload`` errors."""
    if len(body) < FRAME_HEADER:
        raise ValueError(
            f"invalid gRPC frame: expected at least {FRAME_HEADER} bytes for header, got {len(body)}"
        )
    if body[0] == 1:
        raise ValueError("compressed gRPC payload is not supported")
    size = int.from_bytes(body[1:FRAME_HEADER], "big")
    if len(body) < FRAME_HEADER + size:
        raise ValueError(
            f"incomplete gRPC payload: header indicates {size} bytes, "
            f"but only {len(body) - FRAME_HEADER} bytes are available"
        )
    return body[FRAME_HEADER : FRAME_HEADER + size]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError(_WIRE)
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def length_delimited(message: bytes, number: int) -> bytes | None:
    """The last occurrence of the length-delimited field ``number`` (protobuf's merge rule for a
    singular field), skipping every other field; ValueError on malformed wire data."""
    found: bytes | None = None
    i, n = 0, len(message)
    while i < n:
        key, i = _varint(message, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(message, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            size, i = _varint(message, i)
            if i + size > n:
                raise ValueError(_WIRE)
            if key >> 3 == number:
                found = message[i : i + size]
            i += size
        else:
            raise ValueError(_WIRE)
        if i > n:
            raise ValueError(_WIRE)
    return found


class VertexAIParser(PluginBase):
    """Type ``vertexai-parser``; app protocol ``kubernetes.io/h2c``.  No parameters.

    Request (upstream's ``ParseRequest``, by the ``:path`` suffix): ``PredictionService/
    ChatCompletions`` parses the wrapped JSON as ``/chat/completions``, ``.../StreamRawPredict``
    and ``.../RawPredict`` as ``/responses`` (the OpenAI parser's checks and messages, prefixed
    ``parsing <Message>: ``); a message without ``http_body`` is ``<Message> has no HttpBody``;
    any other method is forwarded unparsed.  The body is one uncompressed gRPC frame and is
    forwarded unchanged (no model rewrite, as upstream).

    Response usage: each response frame's ``HttpBody.data`` read as OpenAI JSON (a complete
    response's ``usage``), or as SSE lines when a stream's frames carry events.
    """

    TYPE: ClassVar[str] = "vertexai-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"kubernetes.io/h2c"})
    PATHS: ClassVar[tuple[str, ...]] = tuple(method for method, _, _ in METHODS)

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._openai = OpenAIParser(name, params, handle)  # parses the wrapped JSON

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = headers.get(":path", "")
        for suffix, message, openai_path in METHODS:
            if path.endswith(suffix):
                return self._wrapped(body, headers, message, openai_path)
        return RequestBody(api=ApiKind.RAW, raw=body)

    def _wrapped(
        self, body: bytes, headers: Mapping[str, str], message: str, openai_path: str
    ) -> RequestBody:
        try:
            payload = grpc_payload(body)
        except ValueError as err:
            raise BadRequest(f"invalid or unsupported gRPC payload: {err}") from None
        try:
            http_body = length_delimited(payload, HTTP_BODY_FIELD)
            data = length_delimited(http_body, DATA_FIELD) if http_body is not None else None
        except ValueError as err:
            raise BadRequest(f"unmarshaling {message}: {err}") from None
        if http_body is None:
            raise BadRequest(f"{message} has no HttpBody")
        inner = dict(headers)
        inner[":path"] = openai_path
        try:
            parsed = self._openai.parse_request(data or b"", inner)
        except BadRequest as err:
            raise BadRequest(f"parsing {message}: {err}") from None
        # Routing reads the JSON; what goes upstream is the gRPC call as received.
        return RequestBody(
            api=parsed.api,
            raw=body,
            json=parsed.json,
            prompt_text=parsed.prompt_text,
            token_ids=parsed.token_ids,
            stream=parsed.stream,
            cache_salt=parsed.cache_salt,
        )

    def serialize_request(self, body: RequestBody) -> bytes:
        return body.raw

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        return HttpBodyUsageParser()


class HttpBodyUsageParser:
    """Reads ``HttpBody`` response frames however the chunks split them; the latest usage wins.

    A frame's data holding a JSON object is a complete response (its ``usage``); otherwise it
    is fed to an SSE usage parser (a streamed response's events).  A frame larger than
    ``MAX_RESPONSE_FRAME_BYTES`` is skipped, not buffered.
    """

    __slots__ = ("_buf", "_skip", "_sse", "_usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized frame still to drop
        self._sse: SseUsageParser | None = None
        self._usage: Usage | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> Usage | None:
        if self._skip:
            dropped = min(self._skip, len(chunk))
            self._skip -= dropped
            chunk = chunk[dropped:]
        self._buf += chunk
        buf = self._buf
        while len(buf) >= FRAME_HEADER:
            size = int.from_bytes(buf[1:FRAME_HEADER], "big")
            if size > MAX_RESPONSE_FRAME_BYTES:
                self._skip = max(0, FRAME_HEADER + size - len(buf))
                del buf[: FRAME_HEADER + size]
                continue
            if len(buf) < FRAME_HEADER + size:
                break
            compressed = buf[0] == 1
            payload = bytes(buf[FRAME_HEADER : FRAME_HEADER + size])
            del buf[: FRAME_HEADER + size]
            if not compressed:
                self._frame(payload)
        return self._usage

    def _frame(self, payload: bytes) -> None:
        try:
            data = length_delimited(payload, DATA_FIELD)
        except ValueError:
            return
        if not data or b'"usage"' not in data:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            usage = usage_of_response(obj)
            if usage is not None:
                self._usage = usage
            return
        if self._sse is None:
            self._sse = SseUsageParser()
        usage = self._sse.feed(data if data.endswith(b"\n") else data + b"\n", False)
        if usage is not None:
            self._usage = usage
