"""Hand-encoded protobuf for the replies sent on every request and every response chunk.

Building nested upb messages and serialising them costs microseconds per message, and the
hot replies have fixed shapes with one or two variable strings.  These functions emit the
same bytes upb would (fields in number order), except that an empty string is written as a
zero-length field where upb omits a field at its default: both decode to the same message.

A fenced re-implementation (issue #14), a leaf: it imports nothing of the EPP.  Its reference
is upb, the ``protobuf`` package's generated messages (``epp._pb``): tests/server/test_wire.py
checks, on hypothesis-generated replies, that these bytes (and the replies ``responses``
assembles from them) parse to the message the generated classes build, byte for byte where
the encoding is canonical.  Field numbers, from envoy/service/ext_proc/v3/external_processor.proto
and google/protobuf/struct.proto:

    ProcessingResponse: request_headers=1 response_headers=2 request_body=3 response_body=4
                        dynamic_metadata=8
    HeadersResponse.response=1   BodyResponse.response=1
    CommonResponse: header_mutation=2 body_mutation=3 clear_route_cache=5
    HeaderMutation.set_headers=1 remove_headers=2
    HeaderValueOption.header=1   HeaderValue: key=1 raw_value=3
    BodyMutation.streamed_response=3   StreamedBodyResponse: body=1 end_of_stream=2
    Struct.fields=1 (map entry: key=1 value=2)   Value: string_value=3 struct_value=5
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

_SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(0x80))


def varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + varint(len(payload)) + payload


def header_option(key: str, value: str) -> bytes:
    """One ``HeaderMutation.set_headers`` entry (a HeaderValueOption, field tag included)."""
    header = field(b"\x0a", key.encode()) + field(b"\x1a", value.encode())  # HeaderValue key, raw_value
    return field(b"\x0a", field(b"\x0a", header))  # set_headers[]: HeaderValueOption.header


@functools.lru_cache(maxsize=1024)
def cached_header_option(key: str, value: str) -> bytes:
    """``header_option`` for values that repeat (destinations): encoded once per value."""
    return header_option(key, value)


def headers_reply(options: bytes, *, request: bool, clear_route_cache: bool, metadata: bytes = b"") -> bytes:
    """A RequestHeaders/ResponseHeaders reply setting ``options`` (concatenated ``header_option``s)."""
    common = field(b"\x12", options) + (b"\x28\x01" if clear_route_cache else b"")
    return field(b"\x0a" if request else b"\x12", field(b"\x0a", common)) + metadata


def routing_reply(options: bytes, metadata: bytes, content_length: int = -1) -> bytes:
    """``headers_reply(options, request=True, clear_route_cache=True, metadata=metadata)`` with the
    lengths computed instead of three nested ``field`` calls: the reply that routes every request.

    ``content_length`` >= 0 appends its header option (``content_length_option``) within the same
    join: the reply in one allocation, where the option's own call and three concatenations cost
    ~4k instructions a request more.
    """
    if content_length >= 0:
        digits = str(content_length).encode()
        length_head = _CONTENT_LENGTH_HEADS[len(digits)]
        n = len(options) + len(length_head) + len(digits)
    else:
        digits = length_head = b""
        n = len(options)
    if n < 0x7A:  # every length below fits one byte (the usual reply, ~100 bytes): no varint calls
        small = _SMALL_VARINTS
        return b"".join(
            (
                b"\x0a",
                small[n + 6],
                b"\x0a",
                small[n + 4],
                b"\x12",
                small[n],
                options,
                length_head,
                digits,
                b"\x28\x01",
                metadata,
            )
        )
    options += length_head + digits
    common = 1 + len(varint(n)) + n + 2  # header_mutation, then clear_route_cache
    return b"".join(
        (
            b"\x0a",
            varint(1 + len(varint(common)) + common),
            b"\x0a",
            varint(common),
            b"\x12",
            varint(n),
            options,
        )
    ) + (b"\x28\x01" + metadata)


_CONTENT_LENGTH: Final = "Content-Length"
# ``header_option("Content-Length", v)`` up to its value's bytes, by the value's length in digits.
_CONTENT_LENGTH_HEADS: Final = tuple(
    header_option(_CONTENT_LENGTH, "0" * d)[: -d or None] for d in range(0, 24)
)


def content_length_option(n: int) -> bytes:
    """``header_option("Content-Length", str(n))`` (n >= 0) from a head precomputed per digit count."""
    digits = str(n).encode()
    return _CONTENT_LENGTH_HEADS[len(digits)] + digits


@functools.lru_cache(maxsize=1024)  # pure; destinations repeat (one per endpoint or fallback list)
def string_metadata(namespace: str, key: str, value: str) -> bytes:
    """``ProcessingResponse.dynamic_metadata`` = ``{namespace: {key: value}}`` with a string value."""
    inner = field(b"\x0a", field(b"\x0a", key.encode()) + field(b"\x12", field(b"\x1a", value.encode())))
    outer = field(b"\x0a", namespace.encode()) + field(b"\x12", field(b"\x2a", inner))
    return field(b"\x42", field(b"\x0a", outer))


def options(pairs: Iterable[tuple[str, str]]) -> bytes:
    return b"".join(header_option(k, v) for k, v in pairs)


def remove_options(keys: Iterable[str]) -> bytes:
    """``HeaderMutation.remove_headers`` entries (field 2), appended after the set_headers."""
    return b"".join(field(b"\x12", k.encode()) for k in keys)


EOS: Final = b"\x10\x01"  # StreamedBodyResponse.end_of_stream = true
# The wrapper bytes before a body reply's chunk, by direction (request) and end_of_stream, then by
# the chunk's length: a plain dict read, so the session's per-chunk path takes them without a call
# (``body_reply`` inlined; an ``lru_cache`` hit alone is ~1.2k instructions, the call ~0.5k).
# Filled by ``body_reply``; each dict starts again past ``HEADS_MAX`` lengths.
BODY_HEADS: Final[tuple[tuple[dict[int, bytes], dict[int, bytes]], ...]] = (({}, {}), ({}, {}))
HEADS_MAX: Final = 4096


def body_reply(chunk: bytes, eos: bool, request: bool) -> bytes:
    """ProcessingResponse{request_body|response_body: BodyResponse{response: CommonResponse{
    body_mutation: BodyMutation{streamed_response: {body, end_of_stream}}}}}.

    The hottest message of a streamed response: the wrapper bytes depend only on
    (length, eos, direction) and are kept (``BODY_HEADS``), so a reply is a lookup and a
    concatenation.
    """
    n = len(chunk)
    heads = BODY_HEADS[request][eos]
    head = heads.get(n)
    if head is None:
        if len(heads) >= HEADS_MAX:
            heads.clear()
        head = heads[n] = _body_head(n, eos, request)
    return b"".join((head, chunk, EOS)) if eos else head + chunk  # a join: one allocation, not two


def _body_head(n: int, eos: bool, request: bool) -> bytes:
    """The wrapper bytes of a body reply whose chunk has ``n`` bytes (``body_reply``)."""
    sbr_len = (1 + len(varint(n)) + n if n else 0) + (len(EOS) if eos else 0)
    bm_len = 1 + len(varint(sbr_len)) + sbr_len  # BodyMutation.streamed_response
    cr_len = 1 + len(varint(bm_len)) + bm_len  # CommonResponse.body_mutation
    br_len = 1 + len(varint(cr_len)) + cr_len  # BodyResponse.response
    return b"".join(
        (
            b"\x1a" if request else b"\x22",  # ProcessingResponse.request_body | response_body
            varint(br_len),
            b"\x0a" + varint(cr_len),
            b"\x1a" + varint(bm_len),
            b"\x1a" + varint(sbr_len),
            b"\x0a" + varint(n) if n else b"",  # StreamedBodyResponse.body (omitted when empty)
        )
    )
