"""``vllmgrpc-parser``: vLLM engine gRPC (``vllm.grpc.engine.VllmEngine``) requests and responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

from google.protobuf.message import DecodeError
from smg_grpc_proto.generated import vllm_engine_pb2

from epp.errors import BadRequest
from epp.parsers.api import UsageParser
from epp.plugin.base import PluginBase
from epp.request import ApiKind, RequestBody, Usage

GENERATE_PATH: Final = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED_PATH: Final = "/vllm.grpc.engine.VllmEngine/Embed"
FRAME_HEADER: Final = 5
# A response frame larger than this is skipped, not buffered (no usage frame comes near it).
MAX_RESPONSE_FRAME_BYTES: Final = 64 * 1024 * 1024

_NOT_PARSABLE: Final = "not able to parse payload"
_COMPRESSED: Final = "compressed vllmgrpc payload is not supported"
_WIRE: Final = "proto: cannot parse invalid wire-format data"  # Go's proto.Unmarshal text


def frame_payload(body: bytes) -> bytes:
    """The message of the first gRPC frame; GIE's checks and messages (trailing bytes ignored)."""
    if len(body) < FRAME_HEADER:
        raise ValueError(_NOT_PARSABLE)
    length = int.from_bytes(body[1:FRAME_HEADER], "big")
    if len(body) < FRAME_HEADER + length:
        raise ValueError(_NOT_PARSABLE)
    if body[0] == 1:
        raise ValueError(_COMPRESSED)
    return body[FRAME_HEADER : FRAME_HEADER + length]


def _parse(message: Any, body: bytes) -> None:
    payload = frame_payload(body)
    try:
        message.ParseFromString(payload)
    except DecodeError:
        raise ValueError(_WIRE) from None


def _generate(body: bytes) -> RequestBody:
    req = vllm_engine_pb2.GenerateRequest()
    _parse(req, body)
    kind = req.WhichOneof("input")
    if kind == "text":
        return RequestBody(api=ApiKind.GRPC_GENERATE, raw=body, prompt_text=req.text, stream=req.stream)
    if kind == "tokenized":
        return RequestBody(
            api=ApiKind.GRPC_GENERATE,
            raw=body,
            prompt_text=req.tokenized.original_text,
            token_ids=req.tokenized.input_ids,  # a read-only Sequence; not copied
            stream=req.stream,
        )
    raise ValueError("not supported request inputType")


def _embed(body: bytes) -> RequestBody:
    req = vllm_engine_pb2.EmbedRequest()
    _parse(req, body)
    if not req.HasField("tokenized"):
        raise ValueError("missing tokenized input in EmbedRequest")
    return RequestBody(
        api=ApiKind.GRPC_EMBED,
        raw=body,
        prompt_text=req.tokenized.original_text,
        token_ids=req.tokenized.input_ids,
    )


class VllmGrpcParser(PluginBase):
    """Parses vLLM engine gRPC calls and finds token usage in their response frames.

    Type ``vllmgrpc-parser``; app protocol ``kubernetes.io/h2c``.

    Request: ``:path`` must be ``/vllm.grpc.engine.VllmEngine/Generate`` or ``.../Embed``
    (else ``unsupported gRPC path: <p>``); the body is one uncompressed gRPC frame.
    ``GenerateRequest.text`` or ``.tokenized.original_text`` become the prompt text,
    ``.tokenized.input_ids`` the token ids, ``.stream`` the streaming flag; ``EmbedRequest``
    needs ``tokenized``. Errors read ``parsing gRPC payload for Generate: <why>`` as in GIE.
    The body is forwarded unchanged and has no model to rewrite.

    Response usage: see ``GrpcUsageParser``. Parameters: none.
    """

    TYPE: ClassVar[str] = "vllmgrpc-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"kubernetes.io/h2c"})
    PATHS: ClassVar[tuple[str, ...]] = (GENERATE_PATH.lstrip("/"), EMBED_PATH.lstrip("/"))

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = headers.get(":path", "")
        try:
            if path == GENERATE_PATH:
                return _generate(body)
            if path == EMBED_PATH:
                return _embed(body)
        except ValueError as err:
            method = "Generate" if path == GENERATE_PATH else "Embed"
            raise BadRequest(f"parsing gRPC payload for {method}: {err}") from None
        raise BadRequest(f"unsupported gRPC path: {path}")

    def serialize_request(self, body: RequestBody) -> bytes:
        return body.raw

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        return GrpcUsageParser()


class GrpcUsageParser:
    """Reads ``GenerateResponse`` (else ``EmbedResponse``) frames, however the chunks split them.

    vLLM's servicer reports ``completion_tokens`` per streamed chunk as the count of that
    chunk's new tokens, and repeats the last chunk's count in the final ``complete`` message
    (one per choice). So completion tokens are the larger of the sum over chunks and the sum
    over ``complete`` messages; prompt and cached tokens are the latest reported. A frame
    counts only when it reports prompt or completion tokens, as in GIE.
    """

    __slots__ = ("_buf", "_cached", "_chunk_sum", "_complete_sum", "_prompt", "_skip", "_usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes still to drop of an oversized frame
        self._prompt = 0
        self._cached: int | None = None
        self._chunk_sum = 0
        self._complete_sum = 0
        self._usage: Usage | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> Usage | None:
        if self._skip:
            dropped = min(self._skip, len(chunk))
            self._skip -= dropped
            chunk = chunk[dropped:]
        if chunk:
            self._buf += chunk
            self._drain()
        return self._usage

    def _drain(self) -> None:
        buf = self._buf
        pos = 0
        while len(buf) - pos >= FRAME_HEADER:
            length = int.from_bytes(buf[pos + 1 : pos + FRAME_HEADER], "big")
            end = pos + FRAME_HEADER + length
            if length > MAX_RESPONSE_FRAME_BYTES:
                self._skip = max(0, end - len(buf))
                pos = min(end, len(buf))
                continue
            if end > len(buf):
                break
            if buf[pos] == 0:  # compressed frames are not supported, as in GIE
                self._frame(buf[pos + FRAME_HEADER : end])
            pos = end
        if pos:
            del buf[:pos]

    def _frame(self, payload: bytearray) -> None:
        resp = vllm_engine_pb2.GenerateResponse()
        kind: str | None
        try:
            resp.ParseFromString(payload)
            kind = resp.WhichOneof("response")
        except DecodeError:
            kind = None
        if kind is None:
            self._embed(payload)
            return
        part = resp.chunk if kind == "chunk" else resp.complete
        prompt, completion = part.prompt_tokens, part.completion_tokens
        if prompt <= 0 and completion <= 0:
            return
        if kind == "chunk":
            self._chunk_sum += completion
        else:
            self._complete_sum += completion
        if prompt > 0:
            self._prompt = prompt
        self._cached = part.cached_tokens
        completion = max(self._chunk_sum, self._complete_sum)
        self._usage = Usage(
            prompt_tokens=self._prompt,
            completion_tokens=completion,
            total_tokens=self._prompt + completion,
            cached_tokens=self._cached,
        )

    def _embed(self, payload: bytearray) -> None:
        resp = vllm_engine_pb2.EmbedResponse()
        try:
            resp.ParseFromString(payload)
        except DecodeError:
            return
        if resp.prompt_tokens > 0:
            self._usage = Usage(prompt_tokens=resp.prompt_tokens, total_tokens=resp.prompt_tokens)
