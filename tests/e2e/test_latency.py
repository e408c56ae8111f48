"""Issue 16 end to end: GIE's predictor-enabled config through Envoy against the simulator.

The predictor learns from the streamed responses, its predictions become valid, and the
latency-SLO admitter sheds a sheddable request that no busy replica can serve within a tiny SLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import pathlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from epp.director.admitters.latency_slo import COLD_KV
from epp.explain.record import SCORES_HEADER, parse_header
from tests.e2e.conftest import FAST_SIM, Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG_PATH = pathlib.Path(__file__).resolve().parents[2] / "config" / "examples" / "predicted-latency.yaml"
CONFIG = CONFIG_PATH.read_text()
MODEL = "mock-model"
OBJECTIVES = """
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1}
---
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10}
"""
SIM = (*FAST_SIM, "--num-gpu-blocks", "1000")  # 16k tokens: a 1k-token prompt is > 2% KV use
SLO = {"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "200"}


def chat(text: str, max_tokens: int = 8) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def warm_up(s: Stack, timeout: float = 60.0) -> dict[str, str]:
    """Send streamed requests with SLO headers until a response carries a valid prediction."""
    n = 0
    async with asyncio.timeout(timeout):
        while True:
            batch = [s.post("/v1/chat/completions", chat(f"warm-up {n + i} " + "word " * (50 * (i % 5))), SLO)
                     for i in range(8)]  # fmt: skip
            n += 8
            for r in await asyncio.gather(*batch):
                assert r.status == 200, r.body
                if "x-epp-predicted-ttft-ms" in r.headers:
                    return dict(r.headers)


async def gauge(hostport: str, name: str) -> float:
    """One of a replica's own gauges (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``)."""
    async with aiohttp.ClientSession() as http, http.get(f"http://{hostport}/metrics") as r:
        for ln in (await r.text()).splitlines():
            if ln.startswith(name + "{"):
                return float(ln.rsplit(" ", 1)[1])
    return 0.0


async def busy(hostport: str) -> bool:
    """What ``latency-slo-admitter`` needs of a replica to shed: a running request and KV use
    at or above its cold mark (a replica below it may take anything)."""
    return (
        await gauge(hostport, "vllm:num_requests_running") >= 1
        and await gauge(hostport, "vllm:kv_cache_usage_perc") >= COLD_KV
    )


@contextlib.asynccontextmanager
async def busy_and_paused(s: Stack) -> AsyncIterator[None]:
    """Every replica runs a long stream (KV in use) and is then paused with one more request
    queued; yields once the EPP's scrape shows every queue, hence the running streams too."""
    started = [asyncio.Event() for _ in s.fleet.hostports]

    async def long_stream(i: int, hostport: str) -> None:
        body = chat(f"background {i} " + "lorem ipsum dolor " * 250, max_tokens=10_000)
        async with s.http.post(f"http://{hostport}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            async for _ in r.content.iter_any():
                started[i].set()

    async def park(hostport: str) -> None:
        body = {"model": MODEL, "prompt": "parked", "max_tokens": 2}
        async with s.http.post(f"http://{hostport}/v1/completions", json=body) as r:
            await r.read()

    streams = [asyncio.create_task(long_stream(i, hp)) for i, hp in enumerate(s.fleet.hostports)]
    parked: list[asyncio.Task[None]] = []
    try:
        async with asyncio.timeout(10):
            for ev in started:
                await ev.wait()
            # Every long stream admitted and holding KV, as the replica itself reports it: paused
            # next, the replicas keep these values, so the EPP scrape below that shows the queued
            # request shows them too (waiting for the queue alone let a replica read cold).
            while True:
                if all([await busy(hp) for hp in s.fleet.hostports]):
                    break
                await asyncio.sleep(0.01)
        for i in range(len(s.fleet.ports)):
            await s.sim_faults(i, paused=True)
        parked = [asyncio.create_task(park(hp)) for hp in s.fleet.hostports]
        async with asyncio.timeout(10):
            while True:
                text = await s.epp_metrics()
                queues = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                          if ln.startswith("inference_pool_per_pod_queue_size")]  # fmt: skip
                if len(queues) == len(s.fleet.ports) and min(queues) >= 1:
                    break
                await asyncio.sleep(0.05)
        yield
    finally:
        for i in range(len(s.fleet.ports)):
            await s.sim_faults(i, paused=False)
        for t in streams:
            t.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        await asyncio.gather(*parked, return_exceptions=True)


async def test_predictor_config_learns_and_sheds(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, config=CONFIG, objectives=OBJECTIVES, sim_args=SIM) as s:
        headers = await warm_up(s)
        ttft = float(headers["x-epp-predicted-ttft-ms"])
        assert math.isfinite(ttft) and ttft > 0
        tpot = float(headers["x-epp-predicted-tpot-ms"])
        assert math.isfinite(tpot) and tpot > 0
        metrics = await s.epp_metrics()
        for name in (
            "inference_objective_request_predicted_ttft_seconds_count",
            "inference_objective_request_predicted_tpot_seconds_count",
            "inference_objective_request_ttft_prediction_duration_seconds_count",
            "inference_objective_request_ttft_seconds_count",
            "epp_latency_prediction_error_ratio_count",
        ):
            assert name in metrics, name

        # A sheddable request with an SLO no replica can meet is admitted while replicas are idle...
        tiny = {"x-slo-ttft-ms": "0.001", "x-gateway-inference-objective": "batch"}
        r = await s.post("/v1/chat/completions", chat("tiny slo, idle pool"), tiny)
        assert r.status == 200, r.body

        async with busy_and_paused(s):
            # ...and shed once every replica is busy (running, KV in use) and none is predicted to meet it.
            try:
                async with asyncio.timeout(10):
                    shed = await s.post("/v1/chat/completions", chat("tiny slo, busy pool"), tiny)
            except TimeoutError:
                pytest.fail("the sheddable request was admitted and routed to a paused replica")
            assert shed.status == 500, shed.body
            assert b"request cannot be admitted" in shed.body
            # A critical request with the same SLO is routed (it completes once the replicas resume).
            vip = {**tiny, "x-gateway-inference-objective": "critical"}
            critical = asyncio.create_task(s.post("/v1/chat/completions", chat("tiny slo, critical"), vip))
            await asyncio.sleep(0)
        assert (await critical).status == 200
        assert "no endpoint can serve sheddable request within its SLO" in s.epp.log_tail(20000)
        metrics = await s.epp_metrics()
        assert 'inference_objective_request_slo_violation_total{model_name="mock-model"' in metrics


MIXED_CONFIG = CONFIG_PATH.with_name("predicted-latency-mixed-slo.yaml").read_text()


async def test_mixed_slo_config_routes_requests_with_and_without_an_slo(tmp_path: pathlib.Path) -> None:
    """The mixed-SLO example (SLO reserve, max-score picker) learns from SLO traffic and then serves
    requests without SLO headers (scored around the reserve) and with them, through Envoy."""
    async with make_stack(tmp_path, config=MIXED_CONFIG, sim_args=SIM) as s:
        await warm_up(s)
        docs = [s.post("/v1/chat/completions", chat(f"document {i} " + "text " * 400, max_tokens=4))
                for i in range(6)]  # fmt: skip
        chats = [s.post("/v1/chat/completions", chat(f"question {i}"), SLO) for i in range(6)]
        replies = await asyncio.gather(*docs, *chats)
        assert all(r.status == 200 for r in replies), [r.status for r in replies]
        # every request was scheduled with valid predictions (the reserve rule needs them)
        assert all("x-epp-predicted-ttft-ms" in r.headers for r in replies)
        assert all(r.epp_choice == r.served_by for r in replies)


EXPLAIN = "x-epp-explain"


async def test_mixed_slo_config_keeps_a_reserve_for_slo_traffic(tmp_path: pathlib.Path) -> None:
    """The mixed-SLO example (latency-scorer bestEffortTTFTMs): once requests with an SLO are about,
    a request without one is kept off the endpoint predicted fastest for it (score 0 in the
    explained breakdown) and goes to another.  The SLO request before it cannot be met anywhere,
    so no headroom is left on the reserve for best-effort work to use."""
    args = [f"--explain-request-header={EXPLAIN}"]
    async with make_stack(tmp_path, config=MIXED_CONFIG, sim_args=SIM, epp_args=args) as s:
        await warm_up(s)
        r = await s.post("/v1/chat/completions", chat("an SLO nobody meets"), {"x-slo-ttft-ms": "0.001"})
        assert r.status == 200, r.body
        best_effort = await s.post(
            "/v1/chat/completions", chat("a document " + "page " * 400), {EXPLAIN: "1"}
        )
        assert best_effort.status == 200, best_effort.body
        rows = parse_header(best_effort.headers[SCORES_HEADER])
        assert {address for address, _, _ in rows} == set(s.fleet.hostports)
        latency = {address: parts["latency-scorer"] for address, _, parts in rows}
        reserved = [address for address, score in latency.items() if score == 0.0]
        assert len(reserved) == 1, latency
        assert best_effort.epp_choice == best_effort.served_by == rows[0][0]
        assert best_effort.epp_choice != reserved[0]
        assert latency[best_effort.epp_choice] == max(latency.values()) > 0.0
