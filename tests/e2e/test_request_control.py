"""Issue 5 end to end: every parser type, model rewrites, priorities and shedding, through Envoy."""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as v
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vg

from tests.e2e.conftest import Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mock-model"
HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def config(plugins: str, profile: str, extra: str = "") -> str:
    return (
        HEADER + f"plugins:\n{plugins}\nschedulingProfiles:\n- name: default\n  plugins:\n{profile}\n{extra}"
    )


async def test_openai_apis_and_anthropic_messages(stack: Stack) -> None:
    """Completions, chat, embeddings and Anthropic messages all route, and their usage is counted."""
    r = await stack.post("/v1/embeddings", {"model": MODEL, "input": ["embed me", "and me"]})
    assert r.status == 200 and r.epp_choice == r.served_by
    assert len(r.json()["data"]) == 2
    body = {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": "hello claude-style"}]}
    r = await stack.post("/v1/messages", body)
    assert r.status == 200 and r.epp_choice == r.served_by
    assert r.json()["usage"]["output_tokens"] == 6
    async with stack.http.post(stack.url + "/v1/messages", json={**body, "stream": True}) as resp:
        text = await resp.text()
    assert "event: message_stop" in text
    metrics = await stack.epp_metrics()
    line = next(ln for ln in metrics.splitlines() if ln.startswith("inference_objective_output_tokens_sum"))
    assert float(line.rsplit(" ", 1)[1]) >= 12  # both Anthropic replies' output tokens were parsed


async def test_vllm_grpc_generate_through_envoy(tmp_path: pathlib.Path) -> None:
    """vLLM's gRPC Generate (unary-stream) routes through Envoy to the chosen replica's gRPC port."""
    cfg = config(
        "- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: vllmgrpc-parser",
        "  - pluginRef: queue-scorer\n  - pluginRef: kv-cache-utilization-scorer",
        "parser: {pluginRef: vllmgrpc-parser}\n",
    )
    async with make_stack(tmp_path, config=cfg, grpc=True) as s:
        async with grpc.aio.insecure_channel(s.url.removeprefix("http://")) as ch:
            stub = vg.VllmEngineStub(ch)
            req = v.GenerateRequest(request_id="g1", text="hello over grpc " * 4, stream=True)
            req.sampling_params.max_tokens = 5
            req.sampling_params.ignore_eos = True
            call = stub.Generate(req)
            metadata = dict(await call.initial_metadata())
            frames = [m async for m in call]
        assert frames[-1].WhichOneof("response") == "complete"
        assert frames[-1].complete.completion_tokens == 5
        assert metadata["x-epp-destination"] == f"127.0.0.1:{metadata['x-inference-port']}"


async def test_passthrough_parser_forwards_any_body(tmp_path: pathlib.Path) -> None:
    """With the passthrough parser, a body that is not JSON at all is routed and forwarded untouched."""
    cfg = config(
        "- type: queue-scorer\n- type: passthrough-parser",
        "  - pluginRef: queue-scorer",
        "parser: {pluginRef: passthrough-parser}\n",
    )
    async with make_stack(tmp_path, config=cfg) as s:
        r = await s.request(
            "POST", "/v1/completions", data=b"not json at all", headers={"content-type": "text/plain"}
        )
        # The replica rejects it (it wants JSON), which proves the bytes reached it unchanged.
        assert r.status == 400 and r.epp_choice == r.served_by
        assert b"inference error" not in r.body


REWRITES = """
kind: InferenceModelRewrite
metadata: {name: alias-to-mock}
spec:
  rules:
  - matches: [{model: {type: Exact, value: my-alias}}]
    targets: [{modelRewrite: mock-model, weight: 1}]
---
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10}
---
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1}
"""


async def test_model_rewrite_from_objectives_file(tmp_path: pathlib.Path) -> None:
    """An InferenceModelRewrite in --objectives-file sends my-alias to mock-model; the client sees my-alias."""
    async with make_stack(tmp_path, objectives=REWRITES) as s:
        r = await s.post("/v1/completions", {"model": "my-alias", "prompt": "rewrite me", "max_tokens": 2})
        assert r.status == 200, r.body
        assert r.json()["model"] == "my-alias"
        r = await s.post("/v1/chat/completions", {"model": "my-alias", "messages": [{"role": "user", "content": "x"}],
                                                  "max_tokens": 2, "stream": True})  # fmt: skip
        assert r.status == 200 and b'"model":"my-alias"' in r.body and b"mock-model" not in r.body
        metrics = await s.epp_metrics()
        assert (
            'inference_extension_model_rewrite_decisions_total{model_name="my-alias",'
            'model_rewrite_name="alias-to-mock",target_model="mock-model"} 2.0' in metrics
        )


SHEDDING = config(
    "- type: queue-scorer\n- type: kv-cache-utilization-scorer\n"
    "- type: utilization-detector\n  parameters: {queueDepthThreshold: 1, metricsStalenessThreshold: 2s}",
    "  - pluginRef: queue-scorer\n  - pluginRef: kv-cache-utilization-scorer",
    "saturationDetector: {pluginRef: utilization-detector}\n",
)


async def saturate(s: Stack) -> list[asyncio.Task[object]]:
    """Pause every replica and park two requests directly on each (the EPP would spread them
    unevenly before it sees any queue) until the EPP's scraped metrics show every queue."""
    for i in range(len(s.fleet.ports)):
        await s.sim_faults(i, paused=True)

    async def park(hostport: str, i: int) -> object:
        body = {"model": MODEL, "prompt": f"parked {i}", "max_tokens": 2}
        async with s.http.post(f"http://{hostport}/v1/completions", json=body) as r:
            await r.read()
            return r

    parked = [asyncio.create_task(park(hp, i)) for hp in s.fleet.hostports for i in range(2)]
    async with asyncio.timeout(10):
        while True:
            text = await s.epp_metrics()
            queues = [
                float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines()
                if ln.startswith("inference_pool_per_pod_queue_size")
            ]
            if queues and min(queues) >= 1:
                return parked
            await asyncio.sleep(0.1)  # poll interval (another process: no event to wait on)


async def test_sheddable_requests_get_429_under_saturation_critical_ones_pass(tmp_path: pathlib.Path) -> None:
    """Legacy admission: while every replica's queue is over threshold, priority < 0 is shed with 429;
    priority >= 0 is still routed and completes once the replicas catch up."""
    async with make_stack(tmp_path, replicas=2, config=SHEDDING, objectives=REWRITES) as s:
        parked = await saturate(s)
        shed = await s.post("/v1/completions", {"model": MODEL, "prompt": "cheap", "max_tokens": 2},
                            headers={"x-gateway-inference-objective": "batch"})  # fmt: skip
        assert shed.status == 429
        assert shed.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert (
            shed.body == b"inference error: ResourceExhausted - system saturated, sheddable request dropped"
        )
        vip = asyncio.create_task(s.post("/v1/completions", {"model": MODEL, "prompt": "vip", "max_tokens": 2},
                                         headers={"x-gateway-inference-objective": "critical"}))  # fmt: skip
        for i in range(len(s.fleet.ports)):
            await s.sim_faults(i, paused=False)
        assert (await vip).status == 200
        assert all(r.status == 200 for r in await asyncio.gather(*parked))  # type: ignore[attr-defined]


async def wait_for_metric(s: Stack, *needles: str, timeout: float = 5.0) -> None:
    """Poll the EPP's /metrics (an external process: no event to wait on) until every needle shows."""
    async with asyncio.timeout(timeout):
        while True:
            text = await s.epp_metrics()
            if all(n in text for n in needles):
                return
            await asyncio.sleep(0.05)  # poll interval


async def test_flow_control_queues_until_capacity_frees(tmp_path: pathlib.Path) -> None:
    """With the flowControl gate, a request arriving at a saturated pool waits in the EPP's queue
    (no 429) and is dispatched once the replicas drain."""
    fc = SHEDDING + "featureGates: [flowControl]\nflowControl: {defaultRequestTTL: 20s}\n"
    async with make_stack(tmp_path, replicas=2, config=fc, objectives=REWRITES) as s:
        parked = await saturate(s)
        body = {"model": MODEL, "prompt": "later", "max_tokens": 2}
        batch = {"x-gateway-inference-objective": "batch"}
        waiting = asyncio.create_task(s.post("/v1/completions", body, headers=batch))
        await wait_for_metric(s, "inference_extension_flow_control_queue_size{", 'priority="-1"')
        assert not waiting.done()
        for i in range(len(s.fleet.ports)):
            await s.sim_faults(i, paused=False)
        assert (await waiting).status == 200
        assert all(r.status == 200 for r in await asyncio.gather(*parked))  # type: ignore[attr-defined]
