"""Tests of /metrics: vLLM names and labels, engine-style alternatives, and that metrics track the engine."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.tokens import count_tokens
from tests.epp_sim.helpers import engine_config, metric_samples, metric_value, pause_when


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await response.text()


@pytest.mark.parametrize(
    ("style", "required"),
    [
        pytest.param(
            "vllm",
            {
                "vllm:num_requests_waiting": {},
                "vllm:num_requests_running": {},
                "vllm:kv_cache_usage_perc": {},
                "vllm:gpu_cache_usage_perc": {},
                "vllm:lora_requests_info": {
                    "max_lora": "1",
                    "running_lora_adapters": "",
                    "waiting_lora_adapters": "",
                },
                "vllm:cache_config_info": {"block_size": "16", "num_gpu_blocks": "26000"},
                "vllm:prefix_cache_queries_total": {},
                "vllm:prefix_cache_hits_total": {},
                "vllm:prompt_tokens_total": {},
                "vllm:generation_tokens_total": {},
                "vllm:time_to_first_token_seconds_count": {},
                "vllm:inter_token_latency_seconds_count": {},
                "vllm:e2e_request_latency_seconds_count": {},
            },
            id="vllm",
        ),
        pytest.param(
            "sglang",
            {
                "sglang:num_queue_reqs": {},
                "sglang:num_running_reqs": {},
                "sglang:token_usage": {},
                "sglang:cache_config_info": {"page_size": "16", "num_pages": "26000"},
            },
            id="sglang",
        ),
        pytest.param(
            "trtllm",
            {
                "trtllm_num_requests_waiting": {},
                "trtllm_num_requests_running": {},
                "trtllm_kv_cache_utilization": {},
                "trtllm_kv_cache_tokens_per_block": {},
                "trtllm_kv_cache_max_blocks": {},
            },
            id="trtllm",
        ),
        pytest.param(
            "triton",
            {
                "nv_trt_llm_request_metrics": {"request_type": "waiting"},
                "nv_trt_llm_kv_cache_block_metrics": {"kv_cache_block_type": "fraction"},
            },
            id="triton",
        ),
    ],
)
async def test_metric_names_per_style(
    http: aiohttp.ClientSession, style: str, required: dict[str, Any]
) -> None:
    """Each style exposes the names (and labels) GIE's core-metrics-extractor reads for that engine."""
    async with Fleet(FleetConfig(engine=engine_config(metrics_style=style))) as fleet:
        text = await scrape(http, fleet.replicas[0].url)
    samples = metric_samples(text)
    for name, labels in required.items():
        assert any(labels.items() <= lbls.items() for lbls, _ in samples.get(name, [])), name
    assert all(name.startswith(style[:2]) or name.startswith("nv_") for name in samples)


@pytest.mark.parametrize(
    ("style", "waiting", "running", "usage", "labels"),
    [
        pytest.param(
            "vllm",
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            {"model_name": "mock-model", "engine": "0"},
            id="vllm",
        ),
        pytest.param(
            "sglang",
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            {"model_name": "mock-model"},
            id="sglang",
        ),
        pytest.param(
            "trtllm",
            "trtllm_num_requests_waiting",
            "trtllm_num_requests_running",
            "trtllm_kv_cache_utilization",
            {},
            id="trtllm",
        ),
    ],
)
@pytest.mark.parametrize(
    ("num_gpu_blocks", "expect_queue"),
    [pytest.param(64, True, id="kv-pressure"), pytest.param(10_000, False, id="ample-kv")],
)
async def test_kv_pressure_shows_in_metrics(
    http: aiohttp.ClientSession,
    style: str,
    waiting: str,
    running: str,
    usage: str,
    labels: dict[str, str],
    num_gpu_blocks: int,
    expect_queue: bool,
) -> None:
    """Under KV pressure the waiting gauge rises and KV usage nears 1; afterwards both drain to 0."""
    config = FleetConfig(
        engine=engine_config(time_scale=1.0, num_gpu_blocks=num_gpu_blocks, metrics_style=style)
    )
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        url = rank.url
        all_in = pause_when(rank.engine, lambda e: len(e.waiting) + len(e.running) == 10)
        body = {"max_tokens": 40}
        tasks = [
            asyncio.create_task(
                http.post(url + "/v1/completions", json={**body, "prompt": f"{i:04d}" + "x" * 796})
            )
            for i in range(10)
        ]
        await all_in.wait()
        text = await scrape(http, url)
        if expect_queue:
            assert (metric_value(text, waiting, **labels), metric_value(text, running, **labels)) == (6, 4)
            assert metric_value(text, usage, **labels) >= 0.8
        else:
            assert (metric_value(text, waiting, **labels), metric_value(text, running, **labels)) == (0, 10)
        await fleet.set_faults(paused=False, slowdown=0.02)  # the rest need not take real time
        for response in await asyncio.gather(*tasks):
            assert response.status == 200
            response.release()
        text = await scrape(http, url)
    assert (metric_value(text, waiting, **labels), metric_value(text, running, **labels)) == (0, 0)
    assert metric_value(text, usage, **labels) == 0.0


async def test_lora_info_reports_running_and_waiting_adapters(http: aiohttp.ClientSession) -> None:
    """With max_loras=1 and two adapters requested, the newest lora_requests_info series shows one running
    and one waiting; older label sets stay, as prometheus_client keeps them (GIE picks the largest value)."""
    config = FleetConfig(engine=engine_config(time_scale=1.0, lora_modules=("a", "b"), max_loras=1))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        both_in = pause_when(rank.engine, lambda e: len(e.waiting) + len(e.running) == 2)
        tasks = [
            asyncio.create_task(rank_post(http, rank.url, {"model": model, "prompt": "q", "max_tokens": 30}))
            for model in ("a", "b")
        ]
        await both_in.wait()
        text = await scrape(http, rank.url)
        await fleet.set_faults(paused=False, slowdown=0.02)
        assert await asyncio.gather(*tasks) == [200, 200]
    series = metric_samples(text)["vllm:lora_requests_info"]
    latest_labels, _ = max(series, key=lambda s: s[1])
    assert {latest_labels["running_lora_adapters"], latest_labels["waiting_lora_adapters"]} == {"a", "b"}
    assert latest_labels["max_lora"] == "1"


async def rank_post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(url + "/v1/completions", json=body) as response:
        await response.read()
        return response.status


async def test_counters_and_modelled_latency_histograms(http: aiohttp.ClientSession) -> None:
    """Token and prefix counters count exactly; latency histograms are in modelled seconds even when the
    simulator runs 100x faster than modelled."""
    prompt = "shared context " * 200  # 3000 chars = 750 tokens
    async with Fleet(FleetConfig(engine=engine_config(time_scale=0.01))) as fleet:
        url = fleet.replicas[0].url
        for _ in range(2):
            assert await rank_post(http, url, {"prompt": prompt, "max_tokens": 5}) == 200
        text = await scrape(http, url)
    tokens = count_tokens(prompt)
    assert metric_value(text, "vllm:prompt_tokens_total") == 2 * tokens
    assert metric_value(text, "vllm:generation_tokens_total") == 10
    assert metric_value(text, "vllm:prefix_cache_queries_total") == 2 * tokens
    assert metric_value(text, "vllm:prefix_cache_hits_total") == (tokens - 1) // 16 * 16
    assert metric_value(text, "vllm:request_success_total", finished_reason="length") == 2
    assert metric_value(text, "vllm:time_to_first_token_seconds_count") == 2
    # first request: 6 ms + 750 x 0.05 ms = 43.5 ms; second: about 6.7 ms; modelled, not wall
    assert metric_value(text, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        0.0435 + 0.0067, abs=0.003
    )
    assert metric_value(text, "vllm:inter_token_latency_seconds_count") == 8
    assert metric_value(text, "vllm:time_to_first_token_seconds_bucket", le="0.04") == 1
