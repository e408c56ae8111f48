"""The no-op floor asks Envoy for the same phases as the EPP it is compared to."""

from __future__ import annotations

from bench.noop_extproc import BUFFERED, FULL_DUPLEX, NoopSession
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server.session import lean_override


def headers_reply(request_mode: int, response_mode: int, *, skip: bool) -> list[pb.ProcessingResponse]:
    s = NoopSession(lambda: "10.0.0.1:8000", skip_response=skip)
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=request_mode,  # type: ignore[arg-type]
            response_body_mode=response_mode,  # type: ignore[arg-type]
        ),
    )
    return s.handle(msg)


def test_floor_sends_the_epps_override_where_envoy_honours_it() -> None:
    (reply,) = headers_reply(BUFFERED, mode_pb.ProcessingMode.STREAMED, skip=True)
    epp = pb.ProcessingResponse.FromString(lean_override(BUFFERED, headers=False)).mode_override
    assert reply.mode_override == epp
    (reply,) = headers_reply(BUFFERED, mode_pb.ProcessingMode.STREAMED, skip=False)
    assert not reply.HasField("mode_override")
    assert headers_reply(FULL_DUPLEX, FULL_DUPLEX, skip=True) == []  # held until the body, no override
