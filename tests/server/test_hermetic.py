"""GIE's hermetic integration cases (gie-inventory §10.2) over a real gRPC ext_proc stream.

Differences from GIE are deliberate and documented in docs/decisions.md: the routing reply
does not echo every request header back (only the destination, Content-Length and a
generated x-request-id are set), and header-only requests go through the scheduler.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.metrics.series import REGISTRY
from tests.server.harness import (
    POOL,
    TRANSPORTS,
    Harness,
    destination_metadata,
    llm_request,
    pods,
    req_body,
    req_headers,
    resp_body,
    resp_headers,
    set_headers,
    streamed,
)

SUBSET = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


@pytest.fixture(params=TRANSPORTS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    async with Harness(transport=request.param) as h:
        yield h


def metric(metric_name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric_name, labels) or 0.0


def assert_routed(replies: list, endpoint: str, body: dict[str, object]) -> None:  # type: ignore[type-arg]
    """A headers reply routing to ``endpoint`` and the body streamed back in one message."""
    assert len(replies) == 2, replies
    headers = set_headers(replies[0])
    assert replies[0].request_headers.response.clear_route_cache
    assert headers["x-gateway-destination-endpoint"] == endpoint
    assert destination_metadata(replies[0]) == endpoint
    sent, eos = streamed(replies[1])
    assert eos
    assert json.loads(sent) == body
    assert headers["content-length"] == str(len(sent))


@pytest.mark.parametrize(
    ("prompt", "model", "target", "pod_specs", "endpoint"),
    [
        pytest.param(
            "test1", "my-model", "my-model-12345", [(0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2)], "192.168.1.2:8000",
            id="1-select-lower-queue-and-kv",
        ),
        pytest.param(
            "test2", "sql-lora", "sql-lora-1fdg2",
            [(0, 0, 0.2, "foo", "bar"), (1, 0, 0.1, "foo", "sql-lora-1fdg2"), (2, 10, 0.2, "foo", "bar")],
            "192.168.1.2:8000", id="2-select-active-lora-low-queue",
        ),
        pytest.param(
            "test3", "sql-lora", "sql-lora-1fdg2",
            [(0, 10, 0.2, "foo", "bar"), (1, 10, 0.4, "foo", "sql-lora-1fdg2"), (2, 10, 0.3, "foo")],
            "192.168.1.2:8000", id="5-lora-despite-higher-kv",
        ),
        pytest.param(
            "test4", "sql-lora", "sql-lora-1fdg2",
            [(0, 6, 0.2, "foo", "bar", "sql-lora-1fdg2"), (1, 0, 0.85, "foo"), (2, 10, 0.9, "foo")],
            "192.168.1.1:8000", id="7-do-not-shed-by-default",
        ),
    ],
)  # fmt: skip
async def test_routing_cases(
    harness: Harness,
    prompt: str,
    model: str,
    target: str,
    pod_specs: list[tuple[Any, ...]],
    endpoint: str,
) -> None:
    """The weighted sum of queue, kv-cache, prefix and LoRA scores picks GIE's endpoint."""
    harness.set_pods(pods(*pod_specs))
    replies = await harness.exchange(llm_request(prompt, model, target))
    assert_routed(replies, endpoint, {"max_tokens": 100, "model": target, "prompt": prompt, "temperature": 0})


async def test_1_counts_request_and_ready_pods(harness: Harness) -> None:
    """Case 1 also bumps request_total with the objective's priority."""
    harness.set_pods(pods((0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2)))
    labels = {"model_name": "my-model", "target_model_name": "my-model-12345", "priority": "2"}
    before = metric("inference_objective_request_total", **labels)
    await harness.exchange(llm_request("test1", "my-model", "my-model-12345"))
    assert metric("inference_objective_request_total", **labels) == before + 1


async def test_3_header_only_with_no_pods_is_500(harness: Harness) -> None:
    """A body-less request with an empty pool: 500 'no pods available in datastore'."""
    harness.set_pods([])
    replies = await harness.exchange([req_headers({"content-type": "application/json"}, eos=True)])
    assert len(replies) == 1
    assert replies[0].immediate_response.status.code == 500
    assert replies[0].immediate_response.body == b"inference error: Internal - no pods available in datastore"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b'{"prompt":"hello world"}', b"inference error: BadRequest - model not found in request body", id="4-missing-model"),
        pytest.param(
            b"no healthy upstream",
            b"inference error: BadRequest - error unmarshaling request bodyMap: invalid character 'o' in literal null (expecting 'u')",
            id="8-invalid-json",
        ),
    ],
)  # fmt: skip
async def test_bad_request_cases(harness: Harness, body: bytes, message: bytes) -> None:
    """Unparseable or model-less bodies get GIE's 400 text, and the stream ends."""
    harness.set_pods(pods((0, 0, 0.2)))
    replies = await harness.exchange([req_headers({"hi": "mom"}), req_body(body)])
    assert len(replies) == 1
    assert replies[0].immediate_response.status.code == 400
    assert replies[0].immediate_response.body == message


async def test_6_passthrough_parser() -> None:
    """The passthrough parser forwards the body unchanged and records empty model labels."""
    config = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}, {type: passthrough-parser}]
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: kv-cache-utilization-scorer}]
parser: {pluginRef: passthrough-parser}
featureGates: [enableLegacyMetrics]
"""
    async with Harness(config) as h:
        h.set_pods(pods((0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2)))
        labels = {"model_name": "", "target_model_name": "", "priority": "2"}
        before = metric("inference_objective_request_total", **labels)
        headers = {
            "hi": "mom",
            "x-request-id": "test-request-id",
            "x-gateway-inference-objective": "my-model",
        }
        replies = await h.exchange([req_headers(headers), req_body(b"passthrough-parser")])
        assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "192.168.1.2:8000"
        assert set_headers(replies[0])["content-length"] == "18"
        assert streamed(replies[1]) == (b"passthrough-parser", True)
        assert metric("inference_objective_request_total", **labels) == before + 1


async def test_9_split_body_across_chunks(harness: Harness) -> None:
    """A body split over two chunks is routed once it is complete (priority 0, rewritten model)."""
    harness.set_pods(pods((0, 4, 0.2, "foo", "bar", "sql-lora-1fdg3"), (1, 4, 0.85, "foo", "sql-lora-1fdg3")))
    headers = {
        "hi": "mom",
        "x-gateway-inference-objective": "sql-lora-sheddable",
        "x-gateway-model-name-rewrite": "sql-lora-1fdg3",
        "x-request-id": "test-request-id",
    }
    replies = await harness.exchange(
        [
            req_headers(headers),
            req_body(b'{"max_tokens":100,"model":"sql-lo', eos=False),
            req_body(b'ra-sheddable","prompt":"test6","temperature":0}'),
        ]
    )
    assert_routed(
        replies,
        "192.168.1.1:8000",
        {"max_tokens": 100, "model": "sql-lora-1fdg3", "prompt": "test6", "temperature": 0},
    )


@pytest.mark.parametrize(
    ("subset", "endpoint"),
    [
        pytest.param(["192.168.1.1:8000", "192.168.1.2:8000", "192.168.1.3:8000"], "192.168.1.2:8000", id="10-best-of-subset"),
        pytest.param(["192.168.1.3:8000"], "192.168.1.3:8000", id="11-partial-subset"),
    ],
)  # fmt: skip
async def test_subset_hint(harness: Harness, subset: list[str], endpoint: str) -> None:
    """Envoy's subset hint restricts the candidates before scoring."""
    harness.set_pods(pods((0, 0, 0.2, "foo"), (1, 0, 0.1, "foo", "sql-lora-1fdg2"), (2, 10, 0.2, "foo")))
    md = {SUBSET: {SUBSET_KEY: subset}}
    replies = await harness.exchange(llm_request("test2", "sql-lora", "sql-lora-1fdg2", metadata=md))
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == endpoint


async def test_12_subset_none_match_is_503(harness: Harness) -> None:
    """A hint that matches no pod leaves no candidate: 503."""
    harness.set_pods(pods((0, 0, 0.2), (1, 0, 0.1)))
    md = {SUBSET: {SUBSET_KEY: ["192.168.1.99:8000"]}}
    replies = await harness.exchange(llm_request("test", "sql-lora", "sql-lora-1fdg2", metadata=md))
    assert replies[0].immediate_response.status.code == 503
    assert replies[0].immediate_response.body == (
        b"inference error: ServiceUnavailable - failed to find endpoint candidates for serving the request"
    )


async def test_13_model_not_in_objectives(harness: Harness) -> None:
    """A model with an objective but no rewrite rule is routed under its own name, priority 2."""
    harness.set_pods(pods((0, 4, 0.2, "foo", "bar")))
    headers = {
        "x-gateway-inference-objective": "direct-model",
        "x-gateway-model-name-rewrite": "direct-model",
    }
    replies = await harness.exchange(
        [
            req_headers(headers),
            req_body(b'{"max_tokens":100,"model":"direct-', eos=False),
            req_body(b'model","prompt":"test6","temperature":0}'),
        ]
    )
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "192.168.1.1:8000"
    assert json.loads(streamed(replies[1])[0])["model"] == "direct-model"


async def test_14_rewrite_rule(harness: Harness) -> None:
    """An InferenceModelRewrite rule changes the body's model; metrics carry both names."""
    harness.set_pods(pods((0, 0, 0.1, "foo", "rewritten-model")))
    labels = {"model_name": "model-to-be-rewritten", "target_model_name": "rewritten-model", "priority": "0"}
    before = metric("inference_objective_request_total", **labels)
    replies = await harness.exchange(
        llm_request("test-rewrite", "model-to-be-rewritten", "model-to-be-rewritten")
    )
    assert json.loads(streamed(replies[1])[0])["model"] == "rewritten-model"
    assert metric("inference_objective_request_total", **labels) == before + 1


async def test_15_simple_get(harness: Harness) -> None:
    """A header-only request is routed at once, without Content-Length."""
    harness.set_pods(pods((0, 0, 0.0, "foo")))
    replies = await harness.exchange(
        [req_headers({"content-type": "text/event-stream", "status": "200"}, eos=True)]
    )
    assert len(replies) == 1
    headers = set_headers(replies[0])
    assert headers["x-gateway-destination-endpoint"] == "192.168.1.1:8000"
    assert "content-length" not in headers


async def routed_then(harness: Harness, *response: object) -> list:  # type: ignore[type-arg]
    harness.set_pods(pods((0, 4, 0.2)))
    replies = await harness.exchange([*llm_request("t", "my-model", "my-model"), *response])  # type: ignore[list-item]
    return replies[2:]


async def test_16_response_buffering_multi_chunk(harness: Harness) -> None:
    """A non-streamed JSON response is echoed with GIE's marker header; chunks pass through in order."""
    replies = await routed_then(
        harness,
        resp_headers({"content-type": "application/json"}),
        resp_body(b'{"a":', eos=False),
        resp_body(b'"b"}', eos=True),
    )
    headers = set_headers(replies[0])
    assert headers["x-went-into-resp-headers"] == "true"
    assert b"".join(streamed(r)[0] for r in replies[1:]) == b'{"a":"b"}'
    assert [streamed(r)[1] for r in replies[1:]] == [False, True]


async def test_17_response_invalid_json_unchanged(harness: Harness) -> None:
    """A response body that is not JSON is forwarded unchanged."""
    replies = await routed_then(
        harness,
        resp_headers({"content-type": "application/json"}),
        resp_body(b"no healthy upstream", eos=True),
    )
    assert streamed(replies[1]) == (b"no healthy upstream", True)


async def test_18_empty_eos_chunk(harness: Harness) -> None:
    """A full JSON chunk followed by an empty end-of-stream chunk: both echoed, EOS on the last."""
    body = b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'
    replies = await routed_then(
        harness,
        resp_headers({"content-type": "application/json"}),
        resp_body(body, eos=False),
        resp_body(b"", eos=True),
    )
    assert b"".join(streamed(r)[0] for r in replies[1:]) == body
    assert streamed(replies[-1])[1]


async def test_19_sse_token_counting(harness: Harness) -> None:
    """SSE chunks are echoed one by one and the usage in them feeds the token histograms."""
    before = metric(
        "inference_objective_input_tokens_sum", model_name="my-model", target_model_name="my-model"
    )
    replies = await routed_then(
        harness,
        resp_headers({"content-type": "text/event-stream", "status": "200"}),
        resp_body(b"data: {}", eos=False),
        resp_body(
            b'data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}\ndata: [DONE]',
            eos=False,
        ),
        resp_body(b"", eos=True),
    )
    assert set_headers(replies[0])["x-went-into-resp-headers"] == "true"
    assert [streamed(r)[1] for r in replies[1:]] == [False, False, True]
    after = metric(
        "inference_objective_input_tokens_sum", model_name="my-model", target_model_name="my-model"
    )
    assert after == before + 7


async def test_1_ready_pods_gauge(harness: Harness) -> None:
    """Case 1's pool gauge: three endpoints with fresh metrics are three ready pods."""
    from epp.datalayer.pool_metrics import PoolMetrics

    harness.set_pods(pods((0, 3, 0.2), (1, 0, 0.1), (2, 10, 0.2)))
    PoolMetrics(harness.datastore).refresh()
    assert metric("inference_pool_ready_pods", name=POOL) == 3
