"""GIE's vLLM-gRPC integration cases (gie-inventory §10.3) over a real ext_proc stream."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as v

from epp.metrics.series import REGISTRY
from tests.server.harness import (
    TRANSPORTS,
    Harness,
    pods,
    req_body,
    req_headers,
    resp_body,
    resp_headers,
    resp_trailers,
    set_headers,
    streamed,
)

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: vllmgrpc-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: lora-affinity-scorer
parser: {pluginRef: vllmgrpc-parser}
featureGates: [enableLegacyMetrics]
"""
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED = "/vllm.grpc.engine.VllmEngine/Embed"
SUBSET = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
STANDARD_PODS = ((0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2))


def frame(msg: object) -> bytes:
    data: bytes = msg.SerializeToString()  # type: ignore[attr-defined]
    return b"\x00" + struct.pack(">I", len(data)) + data


def generate(prompt: str = "test", stream: bool = False) -> bytes:
    return frame(v.GenerateRequest(request_id="r", text=prompt, stream=stream))


def embed(text: str = "test") -> bytes:
    return frame(
        v.EmbedRequest(request_id="r", tokenized=v.TokenizedInput(original_text=text, input_ids=[1, 2, 3]))
    )


def headers(path: str, objective: str = "") -> dict[str, str]:
    h = {"hi": "mom", "x-request-id": "test-request-id", ":path": path}
    if objective:
        h["x-gateway-inference-objective"] = objective
    return h


@pytest.fixture(params=TRANSPORTS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with Harness(CONFIG, transport=request.param) as h:
        yield h


def total(priority: str) -> float:
    labels = {"model_name": "", "target_model_name": "", "priority": priority}
    return REGISTRY.get_sample_value("inference_objective_request_total", labels) or 0.0


@pytest.mark.parametrize(
    ("path", "body", "pod_specs", "objective", "endpoint"),
    [
        pytest.param(GENERATE, generate(), STANDARD_PODS, "inference-objective-with-priority-4", "192.168.1.2:8000", id="1-generate"),
        pytest.param(EMBED, embed(), STANDARD_PODS, "inference-objective-with-priority-4", "192.168.1.2:8000", id="2-embed"),
        pytest.param(GENERATE, generate(stream=True), STANDARD_PODS, "inference-objective-with-priority-4", "192.168.1.2:8000", id="3-stream"),
        pytest.param(GENERATE, generate(), ((0, 6, 0.2), (1, 0, 0.85), (2, 10, 0.9)), "", "192.168.1.1:8000", id="4-no-objective"),
    ],
)  # fmt: skip
async def test_routes_grpc_requests(
    harness: Harness,
    path: str,
    body: bytes,
    pod_specs: tuple[Any, ...],
    objective: str,
    endpoint: str,
) -> None:
    """gRPC Generate/Embed frames are routed by load; the body is forwarded byte for byte."""
    harness.set_pods(pods(*pod_specs))
    priority = "4" if objective else "0"
    before = total(priority)
    replies = await harness.exchange([req_headers(headers(path, objective)), req_body(body)])
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == endpoint
    assert streamed(replies[1]) == (body, True)
    assert total(priority) == before + 1


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(GENERATE, b"plain text not grpc payload style", b"inference error: BadRequest - parsing gRPC payload for Generate: not able to parse payload", id="5-not-a-frame"),
        pytest.param("unsupportedMethod", generate(), b"inference error: BadRequest - unsupported gRPC path: unsupportedMethod", id="6-bad-path"),
    ],
)  # fmt: skip
async def test_bad_grpc_requests(harness: Harness, path: str, body: bytes, message: bytes) -> None:
    """Payloads or paths the vLLM engine API does not have are 400s with GIE's text."""
    harness.set_pods(pods(*STANDARD_PODS))
    replies = await harness.exchange([req_headers(headers(path)), req_body(body)])
    assert replies[0].immediate_response.status.code == 400
    assert replies[0].immediate_response.body == message


async def test_7_frame_split_across_chunks(harness: Harness) -> None:
    """A gRPC frame split over two body chunks is reassembled before parsing."""
    harness.set_pods(pods((0, 0, 0.1), (1, 5, 0.5)))
    body = generate("a longer prompt split in two")
    replies = await harness.exchange(
        [req_headers(headers(GENERATE)), req_body(body[:7], eos=False), req_body(body[7:])]
    )
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "192.168.1.1:8000"
    assert streamed(replies[1]) == (body, True)


async def test_8_header_only_with_no_pods(harness: Harness) -> None:
    """A header-only gRPC request with an empty pool is GIE's 500."""
    harness.set_pods([])
    replies = await harness.exchange([req_headers(headers(GENERATE), eos=True)])
    assert replies[0].immediate_response.status.code == 500


@pytest.mark.parametrize(
    ("subset", "endpoint", "status"),
    [
        pytest.param(["192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"], "192.168.1.2:8000", 0, id="9-best-of-subset"),
        pytest.param(["192.168.1.3:8000"], "192.168.1.3:8000", 0, id="10-partial"),
        pytest.param(["192.168.1.99:8000"], "", 503, id="11-none-match"),
    ],
)  # fmt: skip
async def test_grpc_subset(harness: Harness, subset: list[str], endpoint: str, status: int) -> None:
    """The subset hint applies to gRPC requests as to JSON ones."""
    harness.set_pods(pods(*STANDARD_PODS))
    md = {SUBSET: {SUBSET_KEY: subset}}
    replies = await harness.exchange(
        [req_headers(headers(GENERATE), metadata=md), req_body(generate(), metadata=md)]
    )
    if status:
        assert replies[0].immediate_response.status.code == status
    else:
        assert set_headers(replies[0])["x-gateway-destination-endpoint"] == endpoint


def response_frame(complete: bool, prompt: int = 7, completion: int = 10) -> bytes:
    if complete:
        return frame(
            v.GenerateResponse(
                complete=v.GenerateComplete(prompt_tokens=prompt, completion_tokens=completion)
            )
        )
    return frame(
        v.GenerateResponse(
            chunk=v.GenerateStreamChunk(token_ids=[1], prompt_tokens=prompt, completion_tokens=1)
        )
    )


async def routed(harness: Harness, *response: object, stream: bool = False) -> list:  # type: ignore[type-arg]
    harness.set_pods(pods((0, 0, 0.1)))
    msgs = [req_headers(headers(GENERATE)), req_body(generate(stream=stream)), *response]
    return (await harness.exchange(msgs))[2:]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(response_frame(True), id="12-valid-frame"),
        pytest.param(b"\x00\x00\x00\x00\x05garbage-not-proto", id="13-invalid-frame"),
    ],
)
async def test_grpc_response_with_trailers(harness: Harness, body: bytes) -> None:
    """A gRPC response split in two chunks, then trailers: chunks echoed, then a trailers reply."""
    replies = await routed(
        harness,
        resp_headers({"content-type": "application/grpc"}),
        resp_body(body[:4], eos=False),
        resp_body(body[4:], eos=False),
        resp_trailers(),
    )
    assert set_headers(replies[0])["x-went-into-resp-headers"] == "true"
    assert b"".join(streamed(r)[0] for r in replies[1:-1]) == body
    assert not any(streamed(r)[1] for r in replies[1:-1])
    assert replies[-1].WhichOneof("response") == "response_trailers"


def tokens(kind: str) -> float:
    labels = {"model_name": "", "target_model_name": ""}
    return REGISTRY.get_sample_value(f"inference_objective_{kind}_tokens_sum", labels) or 0.0


async def test_14_usage_from_generate_complete(harness: Harness) -> None:
    """GenerateComplete's prompt tokens reach inference_objective_input_tokens."""
    before = tokens("input")
    await routed(
        harness,
        resp_headers({"content-type": "application/grpc"}),
        resp_body(response_frame(True), eos=False),
        resp_trailers(),
    )
    assert tokens("input") == before + 7


async def test_15_streaming_generate(harness: Harness) -> None:
    """A streamed Generate echoes each chunk (no EOS) and records input 7 / output 10 tokens."""
    before_in, before_out = tokens("input"), tokens("output")
    chunks = [response_frame(False) for _ in range(9)] + [response_frame(True, completion=10)]
    replies = await routed(
        harness,
        resp_headers({"content-type": "application/grpc"}),
        *[resp_body(c, eos=False) for c in chunks],
        resp_trailers(),
        stream=True,
    )
    assert [streamed(r)[0] for r in replies[1:-1]] == chunks
    assert tokens("input") == before_in + 7
    assert tokens("output") == before_out + 10
