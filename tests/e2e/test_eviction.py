"""In-flight eviction through real Envoy and the simulator (llm-d-router's
``flowControl.enableEviction``): a sheddable request running on a saturated pool is ended by
flow control when a higher-priority request waits, and the waiting one is then served.

Before its response headers went downstream the evicted request ends with upstream's answer
(429, ``request evicted by flow control``, ``x-llm-d-request-dropped-reason: evicted``); once a
stream has started, Envoy can only reset it.  Either way Envoy resets the model server's
connection, which frees the slot the waiting request takes."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import pytest

from tests.e2e.conftest import FAST_SIM, Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1, concurrencyMode: requests}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
  enableEviction: true
  priorityBands:
  - {priority: 10}
  - {priority: -10}
"""
OBJECTIVES = """
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -10}
---
kind: InferenceObjective
metadata: {name: realtime}
spec: {priority: 10}
"""
SIM = ("--time-scale", "0.5", *FAST_SIM[2:])  # real time: a long generation runs for seconds
LONG = 3000
BATCH = {"x-llm-d-inference-objective": "batch"}
REALTIME = {"x-llm-d-inference-objective": "realtime"}


def chat(max_tokens: int, *, stream: bool) -> dict[str, object]:
    return {
        "model": "mock-model",
        "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def running_on_engine(s: Stack) -> float:
    async with s.http.get(f"http://127.0.0.1:{s.fleet.ports[0]}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.split()[-1])
    return 0.0


async def until_running(s: Stack) -> None:
    """Poll the engine's own metrics page (another process: nothing to await) with a deadline."""
    async with asyncio.timeout(30):
        while True:
            if await running_on_engine(s):
                return
            await asyncio.sleep(0.05)  # poll interval


async def realtime_served(s: Stack) -> None:
    reply = await s.post("/v1/chat/completions", chat(4, stream=False), REALTIME)
    assert reply.status == 200 and reply.json()["choices"]


async def test_an_evicted_request_before_its_response_gets_upstreams_429(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=1, sim_args=SIM, config=CONFIG, objectives=OBJECTIVES) as s:
        batch = asyncio.create_task(s.post("/v1/chat/completions", chat(LONG, stream=False), BATCH))
        await until_running(s)  # the batch request holds the pool's one slot
        realtime = asyncio.create_task(realtime_served(s))
        evicted = await asyncio.wait_for(batch, 30)
        assert evicted.status == 429
        assert evicted.body == b"request evicted by flow control"
        assert evicted.headers["x-llm-d-request-dropped-reason"] == "evicted"
        await asyncio.wait_for(realtime, 30)


async def test_an_evicted_stream_is_cut_and_the_waiting_request_served(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=1, sim_args=SIM, config=CONFIG, objectives=OBJECTIVES) as s:
        chunks, done, reset = 0, False, False
        async with s.http.post(
            s.url + "/v1/chat/completions", json=chat(LONG, stream=True), headers=BATCH
        ) as r:
            assert r.status == 200
            await r.content.readline()  # streaming: the pool's one slot is taken
            realtime = asyncio.create_task(realtime_served(s))
            try:
                async with asyncio.timeout(30):
                    async for line in r.content:
                        chunks += line.startswith(b"data: {")
                        done = done or line.startswith(b"data: [DONE]")
            except aiohttp.ClientPayloadError:
                reset = True  # the headers had gone out: Envoy resets the stream
        await asyncio.wait_for(realtime, 30)
        assert reset and not done and chunks < LONG
