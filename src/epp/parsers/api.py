"""The parser contract: one per wire protocol (OpenAI JSON, vLLM gRPC, passthrough)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable

from epp.plugin.base import Plugin
from epp.request import RequestBody, Usage


class UsageParser(Protocol):
    """Per-response state that extracts usage from body chunks as they stream past.

    Must tolerate any chunk boundaries (an SSE line or a gRPC frame split across chunks)
    and must not copy the whole body when usage is not in it.
    """

    def feed(self, chunk: bytes, end_of_stream: bool) -> Usage | None:
        """Return the usage once found in the stream so far (the latest wins), else None."""
        ...


@runtime_checkable
class Parser(Plugin, Protocol):
    """Turns request bytes into a RequestBody and finds usage in responses."""

    # Pool appProtocols this parser can serve ("http", "kubernetes.io/h2c"); empty = any.
    APP_PROTOCOLS: ClassVar[frozenset[str]]

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        """Parse a complete request body; raise ``epp.errors.BadRequest`` with GIE's message."""
        ...

    def serialize_request(self, body: RequestBody) -> bytes:
        """The bytes to forward after the director changed ``body.json`` (e.g. the model)."""
        ...

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        """A fresh usage parser for a response with these (lower-cased) headers; None = no usage."""
        ...
