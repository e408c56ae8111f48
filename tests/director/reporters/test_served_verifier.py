"""destination-endpoint-served-verifier: GIE's three outcomes, directly and through the ext_proc stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from google.protobuf import struct_pb2

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.admission.shedding import AlwaysAdmit
from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.api import ResponseHeaderProcessor
from epp.director.director import Director, Pipeline
from epp.director.reporters.served_verifier import DestinationEndpointServedVerifier
from epp.parsers.plugins.openai import OpenAIParser
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.server.responses import serialize
from epp.server.session import ExtProcSession
from epp.testing.plugins import FakeHandle, build
from tests.server.harness import as_received

HEADER = "x-conformance-test-served-endpoint"
SERVED = "x-gateway-destination-endpoint-served"


def verifier() -> DestinationEndpointServedVerifier:
    plugin: DestinationEndpointServedVerifier = build(DestinationEndpointServedVerifier, handle=FakeHandle())
    return plugin


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param({"envoy.lb": {SERVED: "10.0.0.1:8080"}}, "10.0.0.1:8080", id="reported"),
        pytest.param({}, "fail: missing envoy lb metadata", id="no-metadata"),
        pytest.param(
            {"other": {SERVED: "10.0.0.1:8080"}}, "fail: missing envoy lb metadata", id="other-namespace"
        ),
        pytest.param(
            {"envoy.lb": "10.0.0.1:8080"}, "fail: missing envoy lb metadata", id="namespace-not-a-map"
        ),
        pytest.param(
            {"envoy.lb": {"some-other-key": "v"}},
            "fail: missing destination endpoint served metadata",
            id="no-served-key",
        ),
        pytest.param(
            {"envoy.lb": {SERVED: 8080.0}},
            "fail: missing destination endpoint served metadata",
            id="served-not-a-string",
        ),
    ],
)
def test_sets_result_header(metadata: Mapping[str, Any], expected: str) -> None:
    """The header is the served endpoint, or GIE's failure text naming what is missing."""
    plugin = verifier()
    assert isinstance(plugin, ResponseHeaderProcessor)
    response = ResponseInfo(request_id="r", headers={"content-type": "application/json"})
    request = InferenceRequest(request_id="r", headers={}, metadata=metadata)
    plugin.response_header(CycleState(), request, response, None)
    assert response.headers == {"content-type": "application/json", HEADER: expected}


class _FirstEndpoint:
    """A scheduler that picks the first candidate."""

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        return SchedulingResult({"default": ProfileRunResult((candidates[0],))}, "default")


def _headers(**pairs: str) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )


def _lb_metadata(**fields: str) -> base_pb2.Metadata:
    s = struct_pb2.Struct()
    s.update(fields)
    return base_pb2.Metadata(filter_metadata={"envoy.lb": s})


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param(_lb_metadata(**{SERVED: "10.0.0.2:3000"}), "10.0.0.2:3000", id="response-metadata"),
        pytest.param(None, "fail: missing envoy lb metadata", id="none"),
    ],
)
def test_reads_response_headers_metadata(metadata: base_pb2.Metadata | None, expected: str) -> None:
    """Through the stream, the value comes from the response-headers message's metadata_context."""
    ds = Datastore()
    ds.upsert(EndpointMetadata(name="default/pod-0-rank-0", address="10.0.0.2", port=3000))
    pipeline = Pipeline(
        parser=build(OpenAIParser),
        scheduler=_FirstEndpoint(),
        admission=AlwaysAdmit(),
        response_header=(verifier(),),
    )
    stream = ExtProcSession(Director(ds, pipeline))
    stream.handle(
        as_received(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(headers=_headers(**{":path": "/"}), end_of_stream=True)
            )
        )
    )
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_headers(**{":status": "200"})))
    if metadata is not None:
        msg.metadata_context.CopyFrom(metadata)
    (raw,) = stream.handle(as_received(msg))
    stream.close()
    reply = pb.ProcessingResponse.FromString(serialize(raw))
    sets = {
        h.header.key: h.header.raw_value.decode()
        for h in reply.response_headers.response.header_mutation.set_headers
    }
    assert sets[HEADER] == expected
