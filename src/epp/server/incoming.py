"""An ext_proc request as the session reads it, decoded from its bytes in C when the extension
was built: a fenced leaf.

Every request brings Envoy's ext_proc messages: its headers, its body, the response's headers
and each streamed chunk.  Parsed by upb and read the protobuf way, they cost the EPP ~100k
instructions a request (docs/decisions.md, "Incoming messages decoded in C"): a wrapper object
per message, per sub-message and per header, a str per field, then the header map turned into
the dict the director reads (~4.5k instructions a header).  ``_incoming.c`` reads the same bytes
straight into the values the session uses: ``Incoming`` below.  It decodes the shapes Envoy sends
on every request; anything else (trailers, metadata, attributes, an odd or malformed encoding,
invalid UTF-8 in a string field) goes to a fallback that decodes it the protobuf way, so the two
never disagree and malformed input fails exactly as before.

This module is a leaf: it imports nothing of the EPP (``_incoming.c`` includes nothing of it).
Its reference is upb, the ``protobuf`` package's generated ``ProcessingRequest`` (``epp._pb``):
tests/server/test_incoming.py checks on hypothesis-generated messages, and on arbitrary bytes,
that the C decoding equals the upb one wherever it answers, and that it answers for the shapes
Envoy sends.  The fallback (``epp.server.messages.from_message``, upb) is bound by the caller:
``decoder(fallback)``.  The extension is compiled by ``hatch_build.py`` at install; when that
failed, or ``EPP_PURE_PYTHON=1`` is set, ``decoder`` returns the fallback itself.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, NamedTuple

PURE_PYTHON_ENV: Final = "EPP_PURE_PYTHON"

# ``Incoming.kind``: the number of the ``ProcessingRequest.request`` oneof field that is set.
NONE: Final = 0
REQUEST_HEADERS: Final = 2
RESPONSE_HEADERS: Final = 3
REQUEST_BODY: Final = 4
RESPONSE_BODY: Final = 5
REQUEST_TRAILERS: Final = 6
RESPONSE_TRAILERS: Final = 7
KIND_NAMES: Final = {
    NONE: "none",
    REQUEST_HEADERS: "request_headers",
    RESPONSE_HEADERS: "response_headers",
    REQUEST_BODY: "request_body",
    RESPONSE_BODY: "response_body",
    REQUEST_TRAILERS: "request_trailers",
    RESPONSE_TRAILERS: "response_trailers",
}


class ProtocolConfig(NamedTuple):
    """``ProcessingRequest.protocol_config`` (Envoy sends it on the first message only)."""

    request_body_mode: int
    response_body_mode: int
    send_body_without_waiting_for_header_response: bool


class Incoming(NamedTuple):
    """One ext_proc request message, as the session reads it."""

    kind: int  # REQUEST_HEADERS ... RESPONSE_TRAILERS, or NONE
    headers: dict[str, str] | None  # the header map of a headers message: lower-cased names, raw_value wins
    body: bytes  # a body message's chunk (b"" for the other kinds)
    end_of_stream: bool  # of a headers or body message
    config: ProtocolConfig | None  # protocol_config, when the message carries one
    metadata: dict[str, Any] | None  # metadata_context's filter metadata as Python values, when carried


Decode = Callable[[bytes | bytearray | memoryview], Incoming]


def _load() -> tuple[ModuleType | None, str]:
    """The compiled module, or None and why not."""
    try:
        # by name, not ``from . import``: the extension is part of this leaf, not an EPP module
        return importlib.import_module(f"{__package__}._incoming"), ""
    except ImportError as e:
        return None, f"the C extension is not built ({e}); reinstall with a C compiler: pip install -e ."


NATIVE, _why = _load()
_forced = os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")
IMPLEMENTATION: Final = "python" if NATIVE is None or _forced else "c"
REASON: Final = f"{PURE_PYTHON_ENV} is set" if _forced else _why
# the SHA-256 of the _incoming.c compiled (a test tells a stale build by it)
BUILT_FROM: Final[str | None] = getattr(NATIVE, "SOURCE_SHA256", None)


def decoder(fallback: Decode) -> Decode:
    """The decode function: the C one, handing what it leaves to ``fallback``; or ``fallback``.

    The C module keeps one fallback (bound here); every caller passes the same upb decoder.
    """
    if NATIVE is None:
        return fallback
    NATIVE.bind(Incoming, ProtocolConfig, fallback)  # bound either way: ``parse`` needs the types
    if IMPLEMENTATION != "c":
        return fallback
    c_decode: Decode = NATIVE.decode
    return c_decode


def parse(data: bytes | bytearray | memoryview) -> Incoming | None:
    """The C decoding alone (for tests and benchmarks): None where the fallback would decode.

    Needs the extension and a bound ``decoder``."""
    if NATIVE is None:
        raise RuntimeError(REASON)
    out: Incoming | None = NATIVE.parse(data)
    return out
