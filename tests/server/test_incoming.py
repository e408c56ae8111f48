"""The C decoding of ext_proc requests against its reference, upb (epp.server.incoming's fence).

Wherever the C decoder answers, its ``Incoming`` equals the one read from upb's message; where
upb rejects the bytes, the C decoder leaves them to upb (so they fail as before); it answers for
the shapes Envoy sends on every request; 100k calls leak nothing; EPP_PURE_PYTHON=1 selects upb.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server import incoming, messages
from epp.server.incoming import Incoming, ProtocolConfig
from tests.native_ext import TOLERANCE, printed_with, traced_growth

SOURCE = Path(incoming.__file__).with_name("_incoming.c")
NATIVE = incoming.NATIVE


def native() -> Any:
    assert NATIVE is not None, incoming.REASON
    return NATIVE


def reference(data: bytes) -> Incoming:
    """upb's reading of the bytes, as the session reads it."""
    return messages.from_message(pb.ProcessingRequest.FromString(data))


def test_the_extension_is_built_here_and_is_the_current_source() -> None:
    """A failed build falls back silently at install (a warning pip hides): this test does not."""
    assert NATIVE is not None, incoming.REASON
    if os.environ.get(incoming.PURE_PYTHON_ENV, "") in ("", "0"):
        assert incoming.IMPLEMENTATION == "c"
        assert messages.decode is NATIVE.decode
    assert hashlib.sha256(SOURCE.read_bytes()).hexdigest() == incoming.BUILT_FROM, (
        "the compiled _incoming is older than _incoming.c: rebuild it (pip install -e .)"
    )


# --- messages as Envoy builds them ------------------------------------------------------------

header_names = st.one_of(
    st.sampled_from([":path", ":method", "Content-Type", "X-Request-Id", "x-gateway-model-name", ""]),
    st.text(max_size=12),  # any Unicode: str.lower() where it is not ASCII
)
raw_values = st.one_of(st.binary(max_size=20), st.just(b"\xff\xfe caf\xc3\xa9"), st.just(b""))


@st.composite
def header_values(draw: st.DrawFn) -> base_pb2.HeaderValue:
    h = base_pb2.HeaderValue(key=draw(header_names))
    if draw(st.booleans()):
        h.value = draw(st.text(max_size=12))
    if draw(st.booleans()):
        h.raw_value = draw(raw_values)
    return h


@st.composite
def requests(draw: st.DrawFn, *, rare: bool = True) -> pb.ProcessingRequest:
    """A ProcessingRequest of any kind; ``rare``: with the fields the C decoder leaves to upb."""
    kinds = ["request_headers", "response_headers", "request_body", "response_body", None]
    if rare:
        kinds += ["request_trailers", "response_trailers"]
    kind = draw(st.sampled_from(kinds))
    msg = pb.ProcessingRequest()
    if kind in ("request_headers", "response_headers"):
        hm = base_pb2.HeaderMap(headers=draw(st.lists(header_values(), max_size=8)))
        getattr(msg, kind).CopyFrom(pb.HttpHeaders(headers=hm, end_of_stream=draw(st.booleans())))
    elif kind in ("request_body", "response_body"):
        body = pb.HttpBody(body=draw(st.binary(max_size=64)), end_of_stream=draw(st.booleans()))
        body.end_of_stream_without_message = draw(st.booleans())
        getattr(msg, kind).CopyFrom(body)
    elif kind is not None:
        getattr(msg, kind).CopyFrom(pb.HttpTrailers())
    if draw(st.booleans()):
        modes = st.one_of(st.integers(0, 5), st.integers(-(2**31), 2**31 - 1))
        msg.protocol_config.CopyFrom(
            pb.ProtocolConfiguration(
                request_body_mode=draw(modes),  # type: ignore[arg-type]  # any int32: an open enum
                response_body_mode=draw(modes),  # type: ignore[arg-type]
                send_body_without_waiting_for_header_response=draw(st.booleans()),
            )
        )
    msg.observability_mode = draw(st.booleans())
    metadata = draw(st.sampled_from(["none", "empty", "filled"] if rare else ["none", "empty"]))
    if metadata == "empty":  # Envoy adds an empty metadata_context to every message
        msg.metadata_context.SetInParent()
    elif metadata == "filled":
        s = struct_pb2.Struct()
        s.fields["x-gateway-destination-endpoint-served"].string_value = draw(st.text(max_size=8))
        msg.metadata_context.filter_metadata["envoy.lb"].CopyFrom(s)
    return msg


def common_shape(msg: pb.ProcessingRequest) -> bool:
    """What Envoy sends on every request: no trailers, no metadata but an empty metadata_context."""
    kind = msg.WhichOneof("request")
    filled = msg.HasField("metadata_context") and len(msg.metadata_context.filter_metadata) > 0
    return kind not in ("request_trailers", "response_trailers") and not filled


@given(requests())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_c_equals_upb_and_answers_for_every_common_shape(msg: pb.ProcessingRequest) -> None:
    data = msg.SerializeToString()
    expected = reference(data)
    got = incoming.parse(data)
    if common_shape(msg):
        assert got is not None, msg
    if got is not None:
        assert got == expected
        assert type(got) is Incoming
        assert got.config is None or type(got.config) is ProtocolConfig
    assert messages.decode(data) == expected  # C or its fallback, the same answer


@given(
    requests(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3), st.integers(0, 8)
)
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_on_damaged_bytes_c_never_accepts_what_upb_rejects(
    msg: pb.ProcessingRequest, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(msg.SerializeToString())
    for at, byte in flips:
        if data:
            data[at % len(data)] = byte
    raw = bytes(data[: len(data) - cut] if cut < len(data) else data)
    check_against_upb(raw)


@given(st.binary(max_size=64))
@settings(max_examples=400)
def test_on_arbitrary_bytes_c_never_accepts_what_upb_rejects(raw: bytes) -> None:
    check_against_upb(raw)


def check_against_upb(raw: bytes) -> None:
    try:
        expected = reference(raw)
    except DecodeError:
        assert incoming.parse(raw) is None
        with pytest.raises(DecodeError):
            messages.decode(raw)
        return
    got = incoming.parse(raw)
    assert got is None or got == expected
    assert messages.decode(raw) == expected


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def field(number: int, wire: int, payload: bytes) -> bytes:
    return varint(number << 3 | wire) + payload


def ld(number: int, payload: bytes) -> bytes:
    return field(number, 2, varint(len(payload)) + payload)


HEADERS = pb.ProcessingRequest(
    request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":Path", raw_value=b"/v1/completions")])
    )
).SerializeToString()

ODD_ENCODINGS = {
    # fields out of order, unknown fields of every wire type, protobuf's merge rules
    "unknown fields": HEADERS
    + field(20, 0, b"\x01")
    + field(21, 1, b"\0" * 8)
    + field(22, 5, b"\0" * 4)
    + ld(23, b"x"),
    "header map twice (merged)": HEADERS + ld(2, ld(1, ld(1, ld(1, b"a") + ld(3, b"1")))),
    "headers then a body (the oneof switches)": HEADERS + ld(4, ld(1, b"body")),
    "config twice (merged)": HEADERS + ld(11, b"\x08\x01") + ld(11, b"\x10\x02"),
    "a group": HEADERS + field(24, 3, b"") + field(24, 4, b""),
    "a bool as length-delimited": ld(5, ld(2, b"\x01")),
    "a key written twice": ld(2, ld(1, ld(1, ld(1, b"a") + ld(1, b"b") + ld(3, b"v")))),
    "raw_value written twice (the last wins)": ld(2, ld(1, ld(1, ld(1, b"a") + ld(3, b"x") + ld(3, b"y")))),
    "a body written twice (the last wins)": ld(5, ld(1, b"a") + ld(1, b"b") + field(2, 0, b"\x01")),
    "a long varint": ld(5, field(2, 0, b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x01")),
    "an overlong varint": ld(5, field(2, 0, b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x02")),
    "an enum past 32 bits": ld(11, field(1, 0, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")),
    "invalid UTF-8 in a key": ld(2, ld(1, ld(1, ld(1, b"\xff")))),
    "an invalid key written over": ld(2, ld(1, ld(1, ld(1, b"\xff") + ld(1, b"ok")))),
    "an invalid value written over": ld(2, ld(1, ld(1, ld(1, b"k") + ld(2, b"\xff") + ld(2, b"ok")))),
    "invalid UTF-8 in a value": ld(2, ld(1, ld(1, ld(1, b"k") + ld(2, b"\xff")))),
    "invalid UTF-8 in a value raw_value replaces": ld(
        2, ld(1, ld(1, ld(1, b"k") + ld(2, b"\xc3") + ld(3, b"r")))
    ),
    "field number 0": b"\x00\x01",
    "empty": b"",
}


@pytest.mark.parametrize("name", ODD_ENCODINGS)
def test_odd_encodings_as_upb(name: str) -> None:
    check_against_upb(ODD_ENCODINGS[name])


def test_what_c_decodes_itself() -> None:
    """The merges and switches go to upb; the last-wins scalars and unknown fields are C's."""
    for name in (
        "unknown fields",
        "raw_value written twice (the last wins)",
        "a body written twice (the last wins)",
    ):
        assert incoming.parse(ODD_ENCODINGS[name]) is not None, name
    for name in (
        "header map twice (merged)",
        "headers then a body (the oneof switches)",
        "config twice (merged)",
    ):
        assert incoming.parse(ODD_ENCODINGS[name]) is None, name
    got = incoming.parse(ODD_ENCODINGS["raw_value written twice (the last wins)"])
    assert got is not None and got.headers == {"a": "y"}


def envoy_messages() -> list[pb.ProcessingRequest]:
    """One request as Envoy 1.40 sends it under GIE's config (captured from bench/overhead's path):
    every message carries an empty metadata_context, the first one the protocol_config too."""
    names = [":authority", ":path", ":method", ":scheme", "content-type", "content-length"]
    names += ["x-forwarded-for", "x-forwarded-proto", "x-envoy-external-address", "x-request-id"]
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=n, raw_value=b"v") for n in names])
    full_duplex = pb.ProtocolConfiguration(
        request_body_mode="FULL_DUPLEX_STREAMED", response_body_mode="FULL_DUPLEX_STREAMED"
    )
    out = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm), protocol_config=full_duplex),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model": "m"}')),
        pb.ProcessingRequest(request_body=pb.HttpBody(end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hm)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
    ]
    for m in out:
        m.metadata_context.SetInParent()
    return out


def test_envoys_own_messages_are_decoded_in_c() -> None:
    for msg in envoy_messages():
        data = msg.SerializeToString()
        got = incoming.parse(data)
        assert got is not None, msg
        assert got == reference(data)
        assert got.metadata == {}


def test_any_bytes_like_object() -> None:
    expected = reference(HEADERS)
    for data in (HEADERS, bytearray(HEADERS), memoryview(HEADERS)):
        assert messages.decode(data) == expected
        assert incoming.parse(data) == expected


def test_bind_refuses_what_it_cannot_build() -> None:
    c = native()

    class Short(NamedTuple):
        a: int

    with pytest.raises(TypeError, match="incoming_type must have 6 fields"):
        c.bind(Short, ProtocolConfig, messages.decode)
    with pytest.raises(TypeError, match="config_type must be a NamedTuple class"):
        c.bind(Incoming, dict, messages.decode)
    with pytest.raises(TypeError, match="fallback must be callable"):
        c.bind(Incoming, ProtocolConfig, 3)
    with pytest.raises(TypeError):
        c.decode("not bytes")


# --- reference counts and memory --------------------------------------------------------------


def exercise(rounds: int) -> None:
    c = native()
    messages = [*fixed_messages(), *envoy_messages()]
    inputs = [*ODD_ENCODINGS.values(), HEADERS, *(m.SerializeToString() for m in messages)]
    for _ in range(rounds):
        for data in inputs:
            c.parse(data)
            with contextlib.suppress(DecodeError):
                c.decode(data)


def fixed_messages() -> list[pb.ProcessingRequest]:
    hm = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key="X-Bad", raw_value=b"\xff"),
            base_pb2.HeaderValue(key="K\u00c9y", value="v"),
            base_pb2.HeaderValue(key="x", value="old", raw_value=b"new"),
        ]
    )
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=hm, end_of_stream=True),
            protocol_config=pb.ProtocolConfiguration(
                request_body_mode="FULL_DUPLEX_STREAMED", response_body_mode="STREAMED"
            ),
        ),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n", end_of_stream=True)),
        pb.ProcessingRequest(response_trailers=pb.HttpTrailers()),
    ]


def test_a_hundred_thousand_calls_leak_nothing() -> None:
    exercise(100)  # warm: the known header names, the types' caches
    gc.collect()
    refs = sys.getrefcount(None), sys.getrefcount(Incoming), sys.getrefcount(ProtocolConfig)
    grown = traced_growth(exercise, settle=500, measured=2_500)  # ~110k calls
    assert grown < TOLERANCE, f"traced memory grew by {grown} bytes"
    assert sys.getrefcount(Incoming) == refs[1]
    assert sys.getrefcount(ProtocolConfig) == refs[2]
    assert abs(sys.getrefcount(None) - refs[0]) < 100  # None is shared with everything else


def test_epp_pure_python_selects_upb() -> None:
    code = (
        "from epp.server import incoming, messages; "
        "print(incoming.IMPLEMENTATION, messages.decode is messages._from_bytes, incoming.REASON)"
    )
    assert printed_with(code, incoming.PURE_PYTHON_ENV, "1") == [
        "python",
        "True",
        *f"{incoming.PURE_PYTHON_ENV} is set".split(),
    ]
    assert printed_with(code, incoming.PURE_PYTHON_ENV, "0")[:2] == ["c", "False"]
