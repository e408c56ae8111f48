"""An in-process EPP behind a real gRPC stream, fed GIE's hermetic fixture (gie-inventory §10.1)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import struct_pb2

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.admission.shedding import LegacyAdmission
from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint
from epp.datastore.objects import apply_objects, load_objects
from epp.datastore.store import Datastore, PoolInfo
from epp.director.director import Director, Pipeline
from epp.server import messages
from epp.server.extproc import ExtProcServicer
from epp.server.incoming import Incoming
from epp.server.transport import ExtProcServer, make_server
from epp.testing.builders import make_endpoint

POOL = "vllm-qwen3-32b-pool"
TRANSPORTS = ("h2", "grpcio")  # the contract tests run over both: grpc core is the client either way

# gie:test/testdata/inferencepool-with-model-hermetic.yaml, as objects this EPP reads.
HERMETIC_OBJECTS = """
kind: InferenceObjective
metadata: {name: sql-lora}
spec: {priority: 2}
---
kind: InferenceObjective
metadata: {name: sql-lora-sheddable}
spec: {}
---
kind: InferenceObjective
metadata: {name: my-model}
spec: {priority: 2}
---
kind: InferenceObjective
metadata: {name: direct-model}
spec: {priority: 2}
---
kind: InferenceObjective
metadata: {name: inference-objective-with-priority-4}
spec: {priority: 4}
---
kind: InferenceModelRewrite
metadata: {name: rewrite-test}
spec:
  rules:
  - matches: [{model: {type: Exact, value: model-to-be-rewritten}}]
    targets: [{modelRewrite: rewritten-model}]
"""

INTEGRATION_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: lora-affinity-scorer
featureGates: [enableLegacyMetrics]
"""

Pod = tuple[Any, ...]  # (index, queue, kv, *active_models)


def pods(*specs: Pod) -> list[Endpoint]:
    return [make_endpoint(s[0], queue=s[1], kv=s[2], active=s[3:]) for s in specs]


def _struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def _metadata(filter_metadata: Mapping[str, Mapping[str, Any]] | None) -> base_pb2.Metadata:
    md = base_pb2.Metadata()
    for ns, value in (filter_metadata or {}).items():
        md.filter_metadata[ns].CopyFrom(_struct(value))
    return md


def header_map(headers: Mapping[str, str]) -> Any:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, value=v) for k, v in headers.items()])


def as_received(msg: pb.ProcessingRequest) -> Incoming:
    """A message as a session receives it: serialised, then decoded as the servers decode it."""
    return messages.decode(msg.SerializeToString())


def req_headers(
    headers: Mapping[str, str], *, eos: bool = False, metadata: Mapping[str, Mapping[str, Any]] | None = None
) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map(headers), end_of_stream=eos),
        metadata_context=_metadata(metadata),
    )


def req_body(
    body: bytes, *, eos: bool = True, metadata: Mapping[str, Mapping[str, Any]] | None = None
) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(
        request_body=pb.HttpBody(body=body, end_of_stream=eos), metadata_context=_metadata(metadata)
    )


def resp_headers(headers: Mapping[str, str], *, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=header_map(headers), end_of_stream=eos)
    )


def resp_body(body: bytes, *, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=eos))


def resp_trailers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


def llm_request(
    prompt: str, model: str, target: str, *, metadata: Mapping[str, Mapping[str, Any]] | None = None
) -> list[pb.ProcessingRequest]:
    """GIE's ReqLLM: control headers, then a completions body in one end-of-stream chunk."""
    headers = {
        "hi": "mom",
        "x-request-id": "test-request-id",
        "x-gateway-inference-objective": model,
        "x-gateway-model-name-rewrite": target,
    }
    body = f'{{"max_tokens":100,"model":"{model}","prompt":"{prompt}","temperature":0}}'.encode()
    return [req_headers(headers, metadata=metadata), req_body(body, metadata=metadata)]


def set_headers(resp: pb.ProcessingResponse) -> dict[str, str]:
    """The header mutations of a headers (or BUFFERED body) reply, keyed case-insensitively."""
    which = resp.WhichOneof("response")
    common = getattr(resp, which).response
    return {h.header.key.lower(): h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def destination_metadata(resp: pb.ProcessingResponse) -> str:
    return (
        resp.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields["x-gateway-destination-endpoint"]
        .string_value
    )


def streamed(resp: pb.ProcessingResponse) -> tuple[bytes, bool]:
    which = resp.WhichOneof("response")
    sr = getattr(resp, which).response.body_mutation.streamed_response
    return sr.body, sr.end_of_stream


class Harness:
    """``async with Harness(config) as h:`` then ``h.set_pods(...)`` and ``await h.exchange(...)``."""

    def __init__(
        self,
        config: str = INTEGRATION_CONFIG,
        *,
        objects: str = HERMETIC_OBJECTS,
        subset_filter: bool = True,
        transport: str = "h2",
    ) -> None:
        self.transport = transport
        self.components = build(load_config(config), default_registry())
        self.datastore = Datastore()
        self.datastore.pool = PoolInfo(name=POOL, target_ports=(8000,), app_protocol="http")
        self.datastore.pool_synced = True
        apply_objects(self.datastore, load_objects(objects))
        c = self.components
        self.director = Director(
            self.datastore,
            Pipeline(
                parser=c.parser,
                scheduler=c.scheduler,
                admission=LegacyAdmission(c.saturation_detector),
                producers=c.producers,
                admitters=c.admitters,
                pre_request=c.pre_request,
                response_header=c.response_header,
                response_body=c.response_body,
                response_complete=c.response_complete,
                subset_filter=subset_filter,
            ),
        )
        self.server: ExtProcServer | None = None
        self.channel: grpc.aio.Channel | None = None

    def set_pods(self, endpoints: Sequence[Endpoint]) -> None:
        """Make the pool exactly these endpoints, with their metrics injected (no scraping)."""
        ds = self.datastore
        ds.replace_all([e.metadata for e in endpoints])
        for e in endpoints:
            live = ds.get(e.name)
            assert live is not None
            live.metrics = e.metrics

    async def __aenter__(self) -> Harness:
        for observer in self.components.observers:
            self.datastore.add_observer(observer)
        self.server = make_server(self.transport, ExtProcServicer(self.director), None)
        port = await self.server.start("127.0.0.1", 0, None)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.server is not None:
            await self.server.stop(0.0)

    async def exchange(self, messages: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
        """Send every message, half-close, and collect replies until the server ends the stream."""
        assert self.channel is not None
        call = pb_grpc.ExternalProcessorStub(self.channel).Process()
        for m in messages:
            with contextlib.suppress(grpc.aio.AioRpcError):  # the server may end early (errors)
                await call.write(m)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.done_writing()
        out: list[pb.ProcessingResponse] = []
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                break
            out.append(msg)
        return out
