"""``sglanghttp-parser`` (llm-d-router main after v0.10): SGLang's native ``/generate``, token ids in.

SGLang's generate endpoint takes a pre-tokenised prompt (``input_ids``) and ``sampling_params``,
not an OpenAI body, and reports usage under ``meta_info`` rather than ``usage``.  The token ids
feed the prefix-aware plugins directly.  The path lookup, the Go error texts, the token id check
and the response buffering and SSE line handling are the OpenAI parser's, shared; only the
usage shape differs (``SglangJsonUsageParser`` / ``SglangSseUsageParser``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import orjson

from epp.errors import BadRequest
from epp.parsers import gojson
from epp.parsers.api import UsageParser
from epp.parsers.plugins.openai import OpenAIParser, decode_error, is_token_ids, request_path
from epp.parsers.sse import SseUsageParser
from epp.parsers.usage import JsonUsageParser, count
from epp.request import ApiKind, RequestBody, Usage

GENERATE_SUFFIX: Final = "generate"
_INVALID: Final = "invalid generate request: "
_WIRE: Final = "sglanghttp.sgLangGenerateWire"  # the Go struct upstream decodes into
# Only a final stream chunk has a non-null finish_reason: the other chunks are never decoded.
_FINAL_CHUNK = re.compile(rb'"finish_reason"[ \t]*:[ \t]*[{"]')


def meta_info_usage(body: Mapping[str, Any]) -> Usage | None:
    """Usage of a ``/generate`` answer: ``meta_info`` prompt, completion and cached tokens."""
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping):
        return None
    prompt = count(meta, "prompt_tokens")
    completion = count(meta, "completion_tokens")
    if prompt is None and completion is None:
        return None
    p, c = prompt or 0, completion or 0
    return Usage(
        prompt_tokens=p, completion_tokens=c, total_tokens=p + c, cached_tokens=count(meta, "cached_tokens")
    )


class SglangJsonUsageParser(JsonUsageParser):
    """A non-streamed ``/generate`` answer: its ``meta_info``."""

    __slots__ = ()
    MARKER: ClassVar[bytes] = b'"meta_info"'

    @staticmethod
    def extract(body: Mapping[str, Any]) -> Usage | None:
        return meta_info_usage(body)


class SglangSseUsageParser(SseUsageParser):
    """A streamed ``/generate`` answer: the ``meta_info`` of the chunk with a ``finish_reason``."""

    __slots__ = ()
    PATTERN: ClassVar[re.Pattern[bytes]] = _FINAL_CHUNK

    def _event(self, event: dict[str, Any]) -> None:
        meta = event.get("meta_info")
        if isinstance(meta, Mapping) and meta.get("finish_reason") is not None:
            usage = meta_info_usage(event)
            if usage is not None:
                self._usage = usage


class SglangHttpParser(OpenAIParser):
    """Type ``sglanghttp-parser``; app protocols ``http``, ``kubernetes.io/h2c``.  No parameters.

    Request (upstream's ``ParseRequest``): the path, trimmed of a trailing slash, must be
    ``/generate`` or ``generate`` (else ``unsupported path: <path>``; ``/inference/v1/generate``
    is vllmhttp-parser's).  The body is decoded as upstream's wire struct: a non-object body or
    a non-boolean ``stream`` is Go's unmarshal error; ``input_ids`` must be present and not
    null (``input_ids must be provided``), ``extra_key`` (the cache salt) a string
    (``unsupported generate request: extra_key must be a string``; SGLang's per-prompt list is
    not supported), and ``input_ids`` a non-empty list of uint32 (batches, text and embeddings
    are refused, as upstream).  Other fields are SGLang's to check.  The body has no model: it
    is forwarded unchanged, no model rewrite (upstream's parser rewrites none either).
    ``sampling_params.max_new_tokens`` is not read (nothing here uses an output budget).

    Response usage: ``meta_info``'s ``prompt_tokens``, ``completion_tokens`` (total their
    sum) and ``cached_tokens``; none when both counts are missing.  Streamed: the chunk whose
    ``meta_info.finish_reason`` is set.
    """

    TYPE: ClassVar[str] = "sglanghttp-parser"
    PATHS: ClassVar[tuple[str, ...]] = (GENERATE_SUFFIX,)

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = request_path(headers).strip().removesuffix("/")
        if path not in (GENERATE_SUFFIX, "/" + GENERATE_SUFFIX):
            raise BadRequest(f"unsupported path: {path}")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise BadRequest(_INVALID + decode_error(body, err)) from None
        if obj is None:
            obj = {}  # Go leaves the struct empty for `null`: no input_ids, refused below
        elif not isinstance(obj, dict):
            raise BadRequest(_INVALID + gojson.type_error(obj, _WIRE))
        stream = obj.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequest(
                _INVALID + gojson.field_type_error(stream, "sgLangGenerateWire", "stream", "bool")
            )
        input_ids = obj.get("input_ids")
        if input_ids is None:
            raise BadRequest(_INVALID + "input_ids must be provided")
        salt = obj.get("extra_key")
        if salt is not None and not isinstance(salt, str):
            raise BadRequest("unsupported generate request: extra_key must be a string")
        if not isinstance(input_ids, list) or (input_ids and not is_token_ids(input_ids)):
            raise BadRequest(_INVALID + "input_ids must be an array of uint32 integers")
        if not input_ids:
            raise BadRequest(_INVALID + "input_ids cannot be empty")
        return RequestBody(
            api=ApiKind.GENERATE,
            raw=body,
            token_ids=input_ids,
            stream=stream is True,
            cache_salt=salt or "",
        )

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return SglangSseUsageParser()
        return SglangJsonUsageParser()
