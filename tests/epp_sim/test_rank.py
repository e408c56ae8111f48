"""Tests of fault injection on one rank: refused connections, crashes, slow or failing /metrics, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from tests.epp_sim.helpers import engine_config, metric_value, pause_when


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with Fleet(FleetConfig(engine=engine_config())) as running_fleet:
        yield running_fleet


async def status_of(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> int:
    async with http.request(method, url, **kwargs) as response:
        await response.read()
        return response.status


async def test_refuse_connections_and_recover(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    """While refusing, new connections fail (idle keep-alive ones are closed too); afterwards the same
    port serves again."""
    rank = fleet.rank(0)
    assert await status_of(http, "GET", rank.url + "/health") == 200  # leaves a keep-alive connection
    await fleet.set_faults(refuse_connections=True)
    with pytest.raises(aiohttp.ClientConnectionError):
        await status_of(http, "GET", rank.url + "/health")
    await fleet.set_faults(refuse_connections=False)
    assert await status_of(http, "GET", rank.url + "/health") == 200


async def test_crash_cuts_streams_and_loses_state(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    """A crash resets in-flight connections, refuses new ones and forgets cached blocks and metrics;
    clearing it brings the replica back empty."""
    rank = fleet.rank(0)
    body = {"prompt": "stream me " * 50, "max_tokens": 100_000 // 8, "stream": True}
    streaming = pause_when(rank.engine, lambda e: e.stats.generation_tokens >= 3)
    async with http.post(rank.url + "/v1/completions", json=body) as response:
        await streaming.wait()
        await fleet.set_faults(crashed=True)
        with pytest.raises(aiohttp.ClientError):
            await response.read()
    with pytest.raises(aiohttp.ClientConnectionError):
        await status_of(http, "GET", rank.url + "/health")
    assert (rank.engine.cache.cached_blocks, rank.engine.stats.generation_tokens) == (0, 0)
    await fleet.set_faults(crashed=False, paused=False)
    assert await status_of(http, "POST", rank.url + "/v1/completions", json={"prompt": "back"}) == 200


async def test_slow_metrics_time_out_a_strict_scraper(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    """metrics_delay_s holds /metrics longer than a scraper's timeout; inference is unaffected."""
    rank = fleet.rank(0)
    await fleet.set_faults(metrics_delay_s=0.5)
    with pytest.raises(TimeoutError):
        await status_of(http, "GET", rank.url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.1))
    assert await status_of(http, "POST", rank.url + "/v1/completions", json={"prompt": "x"}) == 200


@pytest.mark.parametrize(
    ("faults", "method", "path", "status"),
    [
        pytest.param({"metrics_status": 500}, "GET", "/metrics", 500, id="failing-metrics"),
        pytest.param({"unhealthy": True}, "GET", "/health", 503, id="unhealthy"),
        pytest.param({"error_rate": 1.0}, "POST", "/v1/completions", 500, id="every-request-fails"),
        pytest.param({"error_rate": 1.0}, "POST", "/v1/chat/completions", 500, id="chat-fails-too"),
    ],
)
async def test_status_faults(
    fleet: Fleet, http: aiohttp.ClientSession, faults: dict[str, Any], method: str, path: str, status: int
) -> None:
    """Status faults answer the configured error; clearing them restores 200."""
    rank = fleet.rank(0)
    body = {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    await fleet.set_faults(**faults)
    assert await status_of(http, method, rank.url + path, json=body) == status
    await fleet.set_faults(metrics_status=200, unhealthy=False, error_rate=0.0)
    assert await status_of(http, method, rank.url + path, json=body) == 200


async def test_fault_endpoint_on_the_rank_port(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    """POST /sim/faults on a replica's own port changes its knobs; bad values are 400."""
    rank = fleet.rank(0)
    async with http.post(rank.url + "/sim/faults", json={"slowdown": "2.5"}) as response:
        assert (await response.json())["slowdown"] == 2.5
    assert await status_of(http, "POST", rank.url + "/sim/faults", json={"slowdown": "fast"}) == 400
    async with http.get(rank.url + "/sim/state") as response:
        state = await response.json()
    assert (state["name"], state["faults"]["slowdown"], state["listening"]) == ("sim-0", 2.5, True)


async def test_latency_spikes_and_pause(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    """A latency spike on every step shows in modelled TTFT; a paused engine queues requests."""
    rank = fleet.rank(0)
    await fleet.set_faults(latency_spike_prob=1.0, latency_spike_ms=500.0)
    assert (
        await status_of(http, "POST", rank.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        == 200
    )
    async with http.get(rank.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "vllm:time_to_first_token_seconds_sum") >= 0.5
    await fleet.set_faults(paused=True, latency_spike_prob=0.0)
    task = asyncio.create_task(
        status_of(http, "POST", rank.url + "/v1/completions", json={"prompt": "queued"})
    )
    async with http.get(rank.url + "/metrics") as response:
        text = await response.text()
    while metric_value(text, "vllm:num_requests_waiting") < 1:  # the request may still be in flight
        async with http.get(rank.url + "/metrics") as response:
            text = await response.text()
    assert not task.done()
    await fleet.set_faults(paused=False)
    assert await task == 200
