"""ext_proc messages as the session reads them, through upb (the reference the C decoder is held to,
tests/server/test_incoming.py) and through ``decode``, whichever decoder it is."""

from __future__ import annotations

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pb_mode
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server.incoming import REQUEST_HEADERS, RESPONSE_BODY, Incoming, ProtocolConfig
from epp.server.messages import decode, headers_to_dict


def test_header_maps_become_dicts_with_lower_case_keys_and_raw_values_winning() -> None:
    """Keys lower-cased, ``raw_value`` over ``value``, and invalid UTF-8 as U+FFFD wherever it is."""
    hm = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key="X-Mixed", raw_value=b"a"),
            base_pb2.HeaderValue(key="x-old", value="legacy"),
            base_pb2.HeaderValue(key="x-both", value="v", raw_value=b"raw"),
        ]
    )
    assert headers_to_dict(hm) == {"x-mixed": "a", "x-old": "legacy", "x-both": "raw"}
    hm.headers.add(key="x-bad", raw_value=b"caf\xc3\xa9 \xff!")
    assert headers_to_dict(hm) == {
        "x-mixed": "a",
        "x-old": "legacy",
        "x-both": "raw",
        "x-bad": "caf\u00e9 \ufffd!",
    }


def test_decode_reads_what_the_session_needs() -> None:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":Path", raw_value=b"/v1/completions")])
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=hm),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=pb_mode.ProcessingMode.FULL_DUPLEX_STREAMED,
            response_body_mode=pb_mode.ProcessingMode.STREAMED,
        ),
    )
    assert decode(first.SerializeToString()) == Incoming(
        REQUEST_HEADERS, {":path": "/v1/completions"}, b"", False, ProtocolConfig(4, 1, False), None
    )
    chunk = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n", end_of_stream=True))
    assert decode(chunk.SerializeToString()) == Incoming(
        RESPONSE_BODY, None, b"data: {}\n\n", True, None, None
    )


def test_metadata_becomes_python_values() -> None:
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap()))
    served = msg.metadata_context.filter_metadata["envoy.lb"]
    served.fields["x-gateway-destination-endpoint-served"].string_value = "10.0.0.1:8000"
    served.fields["n"].number_value = 2
    got = decode(msg.SerializeToString())
    assert got.metadata == {"envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.1:8000", "n": 2.0}}
    assert got.headers == {}
