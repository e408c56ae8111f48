"""Token usage from OpenAI-, Responses- and Anthropic-shaped JSON, and the non-streamed usage parser."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import orjson

from epp.request import Usage

# A non-streamed response larger than this is forwarded without looking for usage in it.
MAX_BUFFERED_RESPONSE_BYTES: Final = 16 * 1024 * 1024

_CLASSIC_OBJECTS: Final = frozenset({"chat.completion", "chat.completion.chunk", "text_completion"})
# OpenAI and vLLM send prompt_tokens_details; GIE reads prompt_token_details; Responses API
# sends input_tokens_details. All three carry cached_tokens.
_DETAIL_KEYS: Final = ("prompt_tokens_details", "prompt_token_details", "input_tokens_details")


def count(usage: Mapping[str, Any], key: str) -> int | None:
    v = usage.get(key)
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v == v and abs(v) < 2**63:  # NaN and huge floats are not counts
        return int(v)
    return None


def _cached(usage: Mapping[str, Any]) -> int | None:
    for key in _DETAIL_KEYS:
        details = usage.get(key)
        if isinstance(details, Mapping):
            cached = count(details, "cached_tokens")
            if cached is not None:
                return cached
    return count(usage, "cache_read_input_tokens")


def openai_usage(usage: Mapping[str, Any], object_type: object) -> Usage:
    """GIE's field mapping: the ``object`` type decides prompt_*/completion_* vs input_*/output_*."""
    obj = object_type if isinstance(object_type, str) else ""
    if obj.startswith(("response", "conversation")):
        prompt = count(usage, "input_tokens")
        completion = count(usage, "output_tokens")
    elif obj in _CLASSIC_OBJECTS:
        prompt = count(usage, "prompt_tokens")
        completion = count(usage, "completion_tokens")
    else:
        prompt = count(usage, "input_tokens")
        if prompt is None:
            prompt = count(usage, "prompt_tokens")
        completion = count(usage, "output_tokens")
        if completion is None:
            completion = count(usage, "completion_tokens")
    p = prompt or 0
    c = completion or 0
    total = count(usage, "total_tokens")
    return Usage(
        prompt_tokens=p,
        completion_tokens=c,
        total_tokens=p + c if total is None else total,
        cached_tokens=_cached(usage),
    )


def anthropic_usage(usage: Mapping[str, Any]) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; the prompt is their sum."""
    cache_read = count(usage, "cache_read_input_tokens")
    prompt = (
        (count(usage, "input_tokens") or 0)
        + (cache_read or 0)
        + (count(usage, "cache_creation_input_tokens") or 0)
    )
    completion = count(usage, "output_tokens") or 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_tokens=cache_read,
    )


def usage_of_response(body: Mapping[str, Any]) -> Usage | None:
    """Usage of a complete (non-streamed) response object, if it reports one."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return None
    if body.get("type") == "message":
        return anthropic_usage(usage)
    return openai_usage(usage, body.get("object"))


class JsonUsageParser:
    """Buffers a non-streamed response and reads its ``usage`` once the body is complete.

    Bodies over ``max_bytes`` are dropped from the buffer (usage is then unknown), so a large
    download never pins memory here. A body without the bytes ``"usage"`` is never decoded.
    """

    __slots__ = ("_done", "_max_bytes", "_parts", "_size", "_usage")

    # Bytes a body must contain to be decoded, and what reads usage out of the decoded object;
    # subclasses for other shapes change both (sglanghttp-parser's ``meta_info``).
    MARKER: ClassVar[bytes] = b'"usage"'

    @staticmethod
    def extract(body: Mapping[str, Any]) -> Usage | None:
        return usage_of_response(body)

    def __init__(self, max_bytes: int = MAX_BUFFERED_RESPONSE_BYTES) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._max_bytes = max_bytes
        self._done = False
        self._usage: Usage | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> Usage | None:
        if self._done:
            return self._usage
        if chunk:
            self._size += len(chunk)
            if self._size > self._max_bytes:
                self._parts.clear()
                self._done = True
                return None
            self._parts.append(chunk)
        if end_of_stream:
            self._done = True
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts.clear()
            if self.MARKER in body:
                self._usage = self._decode(body)
        return self._usage

    def _decode(self, body: bytes) -> Usage | None:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return self.extract(obj) if isinstance(obj, dict) else None
