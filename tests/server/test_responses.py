"""Hand-encoded body replies are byte-identical to upb's encoding of the same message."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.errors import ResourceExhausted
from epp.server import responses as r


def upb_body(chunk: bytes, eos: bool, request: bool) -> bytes:
    sbr = pb.StreamedBodyResponse(body=chunk, end_of_stream=eos)
    br = pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=sbr)))
    msg = pb.ProcessingResponse(request_body=br) if request else pb.ProcessingResponse(response_body=br)
    return msg.SerializeToString()


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 62000])
@pytest.mark.parametrize("eos", [False, True])
@pytest.mark.parametrize("request_side", [False, True])
def test_body_reply_bytes_match_upb(size: int, eos: bool, request_side: bool) -> None:
    """Every varint width and both directions encode exactly as protobuf would."""
    chunk = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (ours,) = r.streamed_body(chunk, request=request_side, end_of_stream=eos)
    assert ours == upb_body(chunk, eos, request_side)


def test_large_bodies_split_at_62000_bytes_eos_on_last() -> None:
    """A 150,000-byte body becomes three mutations; only the last carries end_of_stream."""
    body = b"x" * 150_000
    msgs = [
        pb.ProcessingResponse.FromString(m) for m in r.streamed_body(body, request=True, end_of_stream=True)
    ]
    parts = [m.request_body.response.body_mutation.streamed_response for m in msgs]
    assert [len(p.body) for p in parts] == [62000, 62000, 26000]
    assert [p.end_of_stream for p in parts] == [False, False, True]


def test_metadata_rides_on_the_last_response_message() -> None:
    """Dynamic metadata appended to the hand-encoded bytes decodes as the message's field."""
    out = r.streamed_response_body(
        b"y" * 70_000, True, {"envoy.lb": {"x-gateway-inference-request-cost": 10}}
    )
    last = pb.ProcessingResponse.FromString(r.serialize(out[-1]))
    assert json_format.MessageToDict(last.dynamic_metadata) == {
        "envoy.lb": {"x-gateway-inference-request-cost": 10}
    }
    assert not pb.ProcessingResponse.FromString(r.serialize(out[0])).HasField("dynamic_metadata")


def test_immediate_error_carries_gie_status_and_text() -> None:
    """An EppError becomes an ImmediateResponse with its HTTP status and GIE's body text."""
    msg = r.immediate_error(ResourceExhausted("system saturated, sheddable request dropped"))
    assert msg.immediate_response.status.code == 429
    assert (
        msg.immediate_response.body
        == b"inference error: ResourceExhausted - system saturated, sheddable request dropped"
    )


def upb_option(key: str, value: str) -> Any:
    from epp._pb.envoy.config.core.v3 import base_pb2

    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))


@pytest.mark.parametrize(
    ("destination", "length", "extra"),
    [
        pytest.param("10.0.0.1:8000", 915, (), id="with-body"),
        pytest.param(
            "10.0.0.1:8000,10.0.0.2:8000", None, (("x-request-id", "abc"),), id="fallbacks-header-only"
        ),
        pytest.param(
            "[fd00::1]:8000", 123456, (("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"),), id="ipv6"
        ),
    ],
)
def test_routing_reply_bytes_match_upb(
    destination: str, length: int | None, extra: tuple[tuple[str, str], ...]
) -> None:
    """The hand-encoded routing reply equals upb's encoding of the same message."""
    sets = [upb_option("x-gateway-destination-endpoint", destination)]
    if length is not None:
        sets.append(upb_option("Content-Length", str(length)))
    sets += [upb_option(k, v) for k, v in extra]
    expected = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=sets)
            )
        )
    )
    expected.dynamic_metadata.fields["envoy.lb"].struct_value.fields[
        "x-gateway-destination-endpoint"
    ].string_value = destination
    assert r.routing_headers_response(destination, length, extra) == expected.SerializeToString()


@pytest.mark.parametrize("extra", [(), (("x-conformance-test-served-endpoint", "10.0.0.1:8000"),)])
def test_response_headers_reply_bytes_match_upb(extra: tuple[tuple[str, str], ...]) -> None:
    """GIE's marker header (plus plugin headers) encodes as upb would."""
    sets = [upb_option("x-went-into-resp-headers", "true")] + [upb_option(k, v) for k, v in extra]
    expected = pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=sets))
        )
    )
    assert r.response_headers_reply(extra) == expected.SerializeToString()


def test_buffered_routing_reply_carries_mutation_body_and_metadata() -> None:
    """The BUFFERED body reply sets the headers, replaces the body and carries envoy.lb metadata."""
    msg = r.routing_body_response("10.0.0.1:8000", b"{}", 2, (("x-request-id", "id"),))
    common = msg.request_body.response
    assert common.clear_route_cache
    assert [(o.header.key, o.header.raw_value) for o in common.header_mutation.set_headers] == [
        ("x-gateway-destination-endpoint", b"10.0.0.1:8000"),
        ("Content-Length", b"2"),
        ("x-request-id", b"id"),
    ]
    assert common.body_mutation.body == b"{}"
    assert json_format.MessageToDict(msg.dynamic_metadata) == {
        "envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}
    }


def test_immediate_error_says_why_in_llm_d_routers_header() -> None:
    from epp.errors import BadRequest, ResourceExhausted, ServiceUnavailable
    from epp.server.responses import DROPPED_REASON_HEADER, immediate_error

    cases = [
        (ResourceExhausted("system saturated"), 429, "rejected-saturated"),
        (ServiceUnavailable("none", reason="rejected-subset-empty"), 503, "rejected-subset-empty"),
        (BadRequest("bad json"), 400, "rejected-bad-request"),
    ]
    for err, status, reason in cases:
        ir = immediate_error(err).immediate_response
        assert ir.status.code == status
        assert ir.body == str(err).encode()
        [opt] = ir.headers.set_headers
        assert (opt.header.key, opt.header.raw_value) == (DROPPED_REASON_HEADER, reason.encode())


def test_routing_reply_carries_endpoint_scores_only_when_asked() -> None:
    from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from epp.explain.record import BREAKDOWN_KEY, SCORES_KEY
    from epp.server.responses import (
        routing_body_response,
        routing_headers_response,
        struct_to_python,
    )

    plain = pb.ProcessingResponse.FromString(routing_headers_response("10.0.0.1:8000", 12, ()))
    assert struct_to_python(plain.dynamic_metadata) == {
        "envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}
    }
    scores = {"10.0.0.1:8000": 2.5, "10.0.0.2:8000": 0.75}
    for msg in (
        pb.ProcessingResponse.FromString(routing_headers_response("10.0.0.1:8000", 12, (), scores)),
        routing_body_response("10.0.0.1:8000", None, None, (), scores),
    ):
        assert struct_to_python(msg.dynamic_metadata) == {
            "envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000", SCORES_KEY: scores}
        }
    # An explained request: the per-scorer breakdown rides beside the final scores.
    breakdown = {
        "10.0.0.1:8000": {"queue-scorer": 1.0, "kv": 1.5},
        "10.0.0.2:8000": {"queue-scorer": 0.5, "kv": 0.25},
    }
    for msg in (
        pb.ProcessingResponse.FromString(
            routing_headers_response("10.0.0.1:8000", 12, (), scores, breakdown=breakdown)
        ),
        routing_body_response("10.0.0.1:8000", None, None, (), scores, breakdown=breakdown),
    ):
        assert struct_to_python(msg.dynamic_metadata) == {
            "envoy.lb": {
                "x-gateway-destination-endpoint": "10.0.0.1:8000",
                SCORES_KEY: scores,
                BREAKDOWN_KEY: breakdown,
            }
        }


def test_routing_replies_remove_headers_as_upb_encodes_them() -> None:
    """P/D: the removed headers ride in HeaderMutation.remove_headers, after the set ones."""
    extra = (("x-prefiller-host-port", "10.0.0.9:8000"),)
    remove = ("x-prefiller-host-port", "x-encoder-hosts-ports")
    expected = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True,
                header_mutation=pb.HeaderMutation(
                    set_headers=[
                        upb_option("x-gateway-destination-endpoint", "10.0.0.1:8000"),
                        upb_option("Content-Length", "5"),
                        upb_option(*extra[0]),
                    ],
                    remove_headers=list(remove),
                ),
            )
        )
    )
    expected.dynamic_metadata.fields["envoy.lb"].struct_value.fields[
        "x-gateway-destination-endpoint"
    ].string_value = "10.0.0.1:8000"
    assert r.routing_headers_response("10.0.0.1:8000", 5, extra, None, remove) == expected.SerializeToString()
    body = r.routing_body_response("10.0.0.1:8000", None, None, (), None, remove)
    assert list(body.request_body.response.header_mutation.remove_headers) == list(remove)


def test_destination_pieces_start_again_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-destination pieces are bounded; a reply from a kept piece and a new one are the same."""
    monkeypatch.setattr(r, "_DESTINATIONS_MAX", 2)
    r._DESTINATION_PIECES.clear()
    first = [r.routing_headers_response(f"10.0.0.{i}:8000", 12, ()) for i in range(5)]
    assert len(r._DESTINATION_PIECES) <= 2
    assert [r.routing_headers_response(f"10.0.0.{i}:8000", 12, ()) for i in range(5)] == first
