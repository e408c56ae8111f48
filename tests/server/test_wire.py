"""Differential tests of the hand-encoded protobuf (``epp.server.wire``, and the replies
``epp.server.responses`` assembles from it) against upb, the ``protobuf`` package's generated
messages (``epp._pb``), on hypothesis-generated input.

For each reply: our bytes, parsed by the generated message class, equal the message built with
the generated classes; and where the encoding is canonical the bytes are equal too.  It is not
canonical (so only parsed messages are compared) for a ``Struct`` of more than one entry (map
entry order is not fixed) and for empty strings: ``wire`` writes an empty key or value as a
zero-length field, upb omits a proto3 field at its default.  Both decode to the same message
(found by these tests; harmless: Envoy parses, it never compares bytes).  A longer run:
``pytest -m fuzz``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import struct_pb2, wrappers_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.type.v3 import http_status_pb2
from epp.errors import BadRequest, EppError, Internal, NotFound, ResourceExhausted, ServiceUnavailable
from epp.server import responses as r
from epp.server import wire

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Strings as Envoy and the EPP produce them: any Unicode scalar (no lone surrogates: not UTF-8).
text = st.text(max_size=40)
# Bodies of every varint width of their length: short, around 127/128, 16383/16384, up to a chunk.
sized = st.sampled_from([0, 1, 127, 128, 129, 16383, 16384, 16385, 62000]).map(lambda n: b"\xab" * n)
bodies = st.one_of(st.binary(max_size=300), sized)
pairs = st.lists(st.tuples(text, text), max_size=4)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),  # NaN != NaN would fail any comparison of parsed messages
    st.integers(-(2**53), 2**53),  # exactly representable as a double, as Struct numbers are
    text,
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=12,
)
metadata = st.dictionaries(text, json_values, max_size=4)


# ---------------------------------------------------------------------------------------------
# the reference: the same messages, built with the generated classes


def ref_value(x: Any) -> struct_pb2.Value:
    """A ``google.protobuf.Value`` built field by field (not through ``Struct.update``)."""
    if x is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(x, bool):
        return struct_pb2.Value(bool_value=x)
    if isinstance(x, (int, float)):
        return struct_pb2.Value(number_value=float(x))
    if isinstance(x, str):
        return struct_pb2.Value(string_value=x)
    if isinstance(x, list):
        return struct_pb2.Value(list_value=struct_pb2.ListValue(values=[ref_value(v) for v in x]))
    return struct_pb2.Value(struct_value=ref_struct(x))


def ref_struct(d: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    for k, v in d.items():
        s.fields[k].CopyFrom(ref_value(v))
    return s


def ref_option(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))


def ref_headers_reply(
    opts: list[tuple[str, str]], *, request: bool, clear_route_cache: bool
) -> pb.ProcessingResponse:
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[ref_option(k, v) for k, v in opts]),
        clear_route_cache=clear_route_cache,
    )
    hr = pb.HeadersResponse(response=common)
    return (
        pb.ProcessingResponse(request_headers=hr) if request else pb.ProcessingResponse(response_headers=hr)
    )


def ref_body_reply(chunk: bytes, eos: bool, request: bool) -> pb.ProcessingResponse:
    sbr = pb.StreamedBodyResponse(body=chunk, end_of_stream=eos)
    br = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=sbr)))
    return pb.ProcessingResponse(request_body=br) if request else pb.ProcessingResponse(response_body=br)


def ref_destination_metadata(namespace: str, key: str, value: str) -> struct_pb2.Struct:
    return ref_struct({namespace: {key: value}})


def parse(data: bytes) -> pb.ProcessingResponse:
    return pb.ProcessingResponse.FromString(data)


def canonical(*strings: str) -> bool:
    """Bytes comparable with upb's: no empty string (wire writes it, upb omits a default field)."""
    return all(strings)


# ---------------------------------------------------------------------------------------------
# wire: the primitives


@FAST
@given(st.integers(0, 2**64 - 1))
def test_varint_is_protobufs(n: int) -> None:
    ours = b"\x08" + wire.varint(n)
    assert wrappers_pb2.UInt64Value.FromString(ours).value == n
    if n:  # upb omits a field at its default (0)
        assert ours == wrappers_pb2.UInt64Value(value=n).SerializeToString()


@FAST
@given(text, text)
def test_header_option_bytes_are_upbs(key: str, value: str) -> None:
    ours = wire.header_option(key, value)
    ref = pb.HeaderMutation(set_headers=[ref_option(key, value)])
    assert pb.HeaderMutation.FromString(ours) == ref
    if canonical(key, value):
        assert ours == ref.SerializeToString()
    assert wire.cached_header_option(key, value) == ours


@FAST
@given(pairs, st.booleans(), st.booleans())
def test_headers_reply_bytes_are_upbs(opts: list[tuple[str, str]], request: bool, clear: bool) -> None:
    ours = wire.headers_reply(wire.options(opts), request=request, clear_route_cache=clear)
    ref = ref_headers_reply(opts, request=request, clear_route_cache=clear)
    assert parse(ours) == ref
    if canonical(*(x for kv in opts for x in kv)):
        assert ours == ref.SerializeToString()


@FAST
@given(text, text, text)
def test_string_metadata_parses_to_the_struct(namespace: str, key: str, value: str) -> None:
    ours = wire.string_metadata(namespace, key, value)
    ref = pb.ProcessingResponse(dynamic_metadata=ref_destination_metadata(namespace, key, value))
    assert parse(ours) == ref
    if canonical(namespace, key, value):
        assert ours == ref.SerializeToString()  # one entry per map: canonical


@FAST
@given(bodies, st.booleans(), st.booleans())
def test_body_reply_bytes_are_upbs(chunk: bytes, eos: bool, request: bool) -> None:
    ours = wire.body_reply(chunk, eos, request)
    ref = ref_body_reply(chunk, eos, request)
    assert parse(ours) == ref
    assert ours == ref.SerializeToString()


def test_body_reply_heads_start_again_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept wrapper bytes are bounded per (direction, end_of_stream); replies stay upb's."""
    monkeypatch.setattr(wire, "HEADS_MAX", 3)
    heads = wire.BODY_HEADS[True][False]
    heads.clear()
    for n in range(7):
        chunk = b"y" * n
        assert wire.body_reply(chunk, False, True) == ref_body_reply(chunk, False, True).SerializeToString()
        assert len(heads) <= 3 and n in heads


# ---------------------------------------------------------------------------------------------
# responses: the replies the EPP sends, assembled from wire's pieces


def check_routing_headers(destination: str, length: int | None, extra: list[tuple[str, str]]) -> None:
    ours = r.routing_headers_response(destination, length, extra)
    opts = [(r.DESTINATION_HEADER, destination)]
    if length is not None:
        opts.append(("Content-Length", str(length)))
    ref = ref_headers_reply(opts + extra, request=True, clear_route_cache=True)
    ref.dynamic_metadata.CopyFrom(
        ref_destination_metadata(r.DESTINATION_NAMESPACE, r.DESTINATION_HEADER, destination)
    )
    assert parse(ours) == ref
    if canonical(destination, *(x for kv in extra for x in kv)):
        assert ours == ref.SerializeToString()


@FAST
@given(st.integers(0, 2**63 - 1))
def test_content_length_option_is_the_header_option(n: int) -> None:
    assert wire.content_length_option(n) == wire.header_option("Content-Length", str(n))


@FAST
@given(
    text | st.text(min_size=100, max_size=400),  # long fallback lists: lengths past one varint byte
    st.sampled_from([0, 9, 10, 99, 100, 127, 128, 16383, 16384]) | st.integers(0, 2**63 - 1),
)
def test_the_usual_routing_reply_is_the_general_encoding(destination: str, length: int) -> None:
    """No extra headers, not explained: the reply from per-destination pieces (``routing_reply``)
    is byte for byte what the general assembly encodes, and upb's message."""
    general = wire.headers_reply(
        wire.header_option(r.DESTINATION_HEADER, destination)
        + wire.header_option("Content-Length", str(length)),
        request=True,
        clear_route_cache=True,
        metadata=wire.string_metadata(r.DESTINATION_NAMESPACE, r.DESTINATION_HEADER, destination),
    )
    assert r.routing_headers_response(destination, length, ()) == general
    check_routing_headers(destination, length, [])


@FAST
@given(text, st.none() | st.integers(0, 2**63 - 1), pairs)
def test_routing_headers_response(destination: str, length: int | None, extra: list[tuple[str, str]]) -> None:
    check_routing_headers(destination, length, extra)


@pytest.mark.fuzz
@LONG
@given(text, st.none() | st.integers(0, 2**63 - 1), pairs)
def test_routing_headers_response_at_length(
    destination: str, length: int | None, extra: list[tuple[str, str]]
) -> None:
    check_routing_headers(destination, length, extra)


@FAST
@given(text, st.none() | bodies, st.none() | st.integers(0, 2**40), pairs)
def test_routing_body_response(
    destination: str, body: bytes | None, length: int | None, extra: list[tuple[str, str]]
) -> None:
    ours = r.routing_body_response(destination, body, length, extra)
    opts = [(r.DESTINATION_HEADER, destination)]
    if length is not None:
        opts.append(("Content-Length", str(length)))
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[ref_option(k, v) for k, v in opts + extra]),
        clear_route_cache=True,
    )
    if body is not None:
        common.body_mutation.body = body
    ref = pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common),
        dynamic_metadata=ref_destination_metadata(r.DESTINATION_NAMESPACE, r.DESTINATION_HEADER, destination),
    )
    assert ours == ref
    assert parse(r.serialize(ours)) == ref


def check_streamed_response_body(body: bytes, eos: bool, md: dict[str, Any]) -> None:
    ours = r.streamed_response_body(body, eos, md)
    assert all(isinstance(m, bytes) for m in ours)
    got = [parse(r.serialize(m)) for m in ours]
    limit = r.BODY_CHUNK_LIMIT
    parts = [body[i : i + limit] for i in range(0, len(body), limit)] or [b""]
    ref = [ref_body_reply(p, eos and i == len(parts) - 1, False) for i, p in enumerate(parts)]
    if md:
        ref[-1].dynamic_metadata.CopyFrom(ref_struct(md))
    assert got == ref  # parsed: a Struct is a map, whose entry order is not canonical
    # and the bodies' wrappers, which hold no map, byte for byte
    for m, p in zip(ours[:-1], ref[:-1], strict=True):
        assert m == p.SerializeToString()


@FAST
@given(st.one_of(bodies, st.integers(62001, 130000).map(lambda n: b"y" * n)), st.booleans(), metadata)
def test_streamed_response_body_with_metadata(body: bytes, eos: bool, md: dict[str, Any]) -> None:
    check_streamed_response_body(body, eos, md)


@pytest.mark.fuzz
@LONG
@given(bodies, st.booleans(), metadata)
def test_streamed_response_body_with_metadata_at_length(body: bytes, eos: bool, md: dict[str, Any]) -> None:
    check_streamed_response_body(body, eos, md)


@FAST
@given(st.none() | bodies, metadata)
def test_replaced_response_body(body: bytes | None, md: dict[str, Any]) -> None:
    br = pb.BodyResponse()
    if body is not None:
        br.response.body_mutation.body = body
    ref = pb.ProcessingResponse(response_body=br)
    if md:
        ref.dynamic_metadata.CopyFrom(ref_struct(md))
    assert parse(r.serialize(r.replaced_response_body(body, md))) == ref


@FAST
@given(pairs)
def test_response_headers_reply(extra: list[tuple[str, str]]) -> None:
    ours = r.response_headers_reply(extra)
    ref = ref_headers_reply([r.RESP_HEADERS_MARKER, *extra], request=False, clear_route_cache=False)
    assert parse(ours) == ref
    if canonical(*(x for kv in extra for x in kv)):
        assert ours == ref.SerializeToString()


@FAST
@given(st.sampled_from([BadRequest, NotFound, ResourceExhausted, Internal, ServiceUnavailable]), text)
def test_immediate_error(cls: type[EppError], message: str) -> None:
    err = cls(message)
    ref = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=cls.http_status),  # type: ignore[arg-type]
            body=str(err).encode(),
        )
    )
    ref.immediate_response.headers.set_headers.add(
        header={"key": r.DROPPED_REASON_HEADER, "raw_value": err.reason.encode()}
    )
    assert parse(r.serialize(r.immediate_error(err))) == ref


@FAST
@given(metadata)
def test_struct_round_trip(md: dict[str, Any]) -> None:
    """``to_struct`` builds the reference Struct; ``struct_to_python`` reads it back (numbers as floats)."""
    assert r.to_struct(md) == ref_struct(md)
    back = r.struct_to_python(r.to_struct(md))

    def norm(x: Any) -> Any:
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return x
        if isinstance(x, (int, float)):
            return float(x) if math.isfinite(x) else x
        if isinstance(x, list):
            return [norm(v) for v in x]
        return {k: norm(v) for k, v in x.items()}

    assert back == norm(md)


def test_routing_reply_is_headers_reply_at_every_length_around_the_one_byte_limit() -> None:
    """The one-byte-length shortcut and the varint path give ``headers_reply``'s bytes."""
    md = wire.string_metadata("envoy.lb", "x-gateway-destination-endpoint", "10.0.0.1:8000")
    for n in range(300):
        options = b"\x0a" * n
        assert wire.routing_reply(options, md) == wire.headers_reply(
            options, request=True, clear_route_cache=True, metadata=md
        )
        for length in (0, 7, 1234):  # its Content-Length option within the same join
            assert wire.routing_reply(options, md, length) == wire.headers_reply(
                options + wire.content_length_option(length),
                request=True,
                clear_route_cache=True,
                metadata=md,
            )
