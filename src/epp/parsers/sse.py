"""Usage from a Server-Sent-Events response: OpenAI/vLLM chunks, Responses API and Anthropic events.

GIE splits each body chunk on newlines and so misses a usage line cut by a chunk boundary.
Here only the unfinished last line is carried to the next chunk, and a complete line is decoded
only when it contains ``"usage"`` followed by an object, so the token-by-token chunks of a
stream cost one regex scan each and no JSON decoding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import orjson

from epp.parsers.usage import anthropic_usage, openai_usage
from epp.request import Usage

# A line longer than this is dropped rather than buffered (no usage event comes near it).
MAX_LINE_BYTES: Final = 4 * 1024 * 1024

# "usage": {  -- not "usage": null, which OpenAI sends on every chunk with include_usage.
_USAGE_OBJECT = re.compile(rb'"usage"[ \t]*:[ \t]*\{')
_ANTHROPIC_KEYS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


class SseUsageParser:
    """Per-response state: the unfinished tail line and the usage seen so far (latest wins).

    Handles ``data:`` with or without the space, LF or CRLF line ends, ``data: [DONE]``, usage
    in any chunk (vLLM ``continuous_usage_stats`` included), Responses API events that carry
    ``response.usage`` (``response.completed``, ``.incomplete``, ``.failed``), and Anthropic
    ``message_start`` + ``message_delta`` whose counts are merged. A JSON payload split over
    several ``data:`` lines of one event is not reassembled (no server emits that).
    """

    __slots__ = ("_anthropic", "_pending", "_pending_size", "_skip_line", "_usage")

    # A line is decoded only when this matches in it; subclasses for other shapes change it
    # and ``_event`` (sglanghttp-parser's ``meta_info``).
    PATTERN: ClassVar[re.Pattern[bytes]] = _USAGE_OBJECT

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # pieces of the unfinished last line
        self._pending_size = 0
        self._skip_line = False  # the unfinished line overflowed MAX_LINE_BYTES
        self._usage: Usage | None = None
        self._anthropic: dict[str, int] | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> Usage | None:
        if chunk:
            # The usual chunk (whole lines, nothing held, no usage in it) costs this one call.
            last_nl = chunk.rfind(b"\n")
            if last_nl == len(chunk) - 1 and not self._pending and not self._skip_line:
                if self.PATTERN.search(chunk) is not None:
                    self._feed(chunk, last_nl)
            elif last_nl == -1:
                self._hold(chunk)
            else:
                self._feed(chunk, last_nl)
        if end_of_stream and self._pending:
            if not self._skip_line:
                self._held_line(self._pending)
            self._pending.clear()
            self._pending_size = 0
        return self._usage

    def _feed(self, chunk: bytes, last_nl: int) -> None:
        """A chunk with at least one newline, at ``last_nl`` (the last)."""
        start = 0
        if self._pending or self._skip_line:
            first_nl = chunk.find(b"\n")
            if not self._skip_line:
                self._pending.append(chunk[:first_nl])
                self._held_line(self._pending)
            self._pending.clear()
            self._pending_size = 0
            self._skip_line = False
            start = first_nl + 1
        end = last_nl + 1
        pattern = self.PATTERN
        m = pattern.search(chunk, start, end)
        while m is not None:
            line_start = max(start, chunk.rfind(b"\n", start, m.start()) + 1)
            line_end = chunk.find(b"\n", m.end(), end)
            self._line(chunk[line_start:line_end])
            m = pattern.search(chunk, line_end + 1, end)
        if end < len(chunk):
            self._hold(chunk[end:])

    def _hold(self, piece: bytes) -> None:
        if self._skip_line:
            return
        self._pending_size += len(piece)
        if self._pending_size > MAX_LINE_BYTES:
            self._pending.clear()
            self._pending_size = 0
            self._skip_line = True
            return
        self._pending.append(piece)

    def _held_line(self, pieces: list[bytes]) -> None:
        """A line that spans chunks; GIE instead reads every chunk as starting a new line.

        GIE's acceptance stream sends ``data: {}`` and the usage event in separate chunks
        without a newline between them, so when the joined line does not decode, each piece
        is tried on its own too.
        """
        line = b"".join(pieces)
        pattern = self.PATTERN
        if not pattern.search(line) or self._line(line) or len(pieces) == 1:
            return
        for piece in pieces:
            if pattern.search(piece):
                self._line(piece)

    def _line(self, line: bytes) -> bool:
        """Handle one complete line; False when it is not a ``data:`` line holding a JSON object."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.startswith(b"data:"):
            return False
        payload = line[6:] if line[5:6] == b" " else line[5:]
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(event, dict):
            return False
        self._event(event)
        return True

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            if kind == "message_delta":
                self._merge_anthropic(usage)
            else:
                self._usage = openai_usage(usage, event.get("object"))
            return
        if not isinstance(kind, str):
            return
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, Mapping) and isinstance(message.get("usage"), Mapping):
                self._merge_anthropic(message["usage"])
        elif kind.startswith("response."):
            response = event.get("response")
            if isinstance(response, Mapping) and isinstance(response.get("usage"), Mapping):
                self._usage = openai_usage(response["usage"], response.get("object") or "response")

    def _merge_anthropic(self, usage: Mapping[str, Any]) -> None:
        """``message_delta`` counts are cumulative and may omit the input side sent at start."""
        merged = self._anthropic if self._anthropic is not None else {}
        for key in _ANTHROPIC_KEYS:
            v = usage.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                merged[key] = v
        self._anthropic = merged
        self._usage = anthropic_usage(merged)
