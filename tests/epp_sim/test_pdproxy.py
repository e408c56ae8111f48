"""The decode-side P/D proxy in front of simulated prefill and decode pods (in process)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from epp_sim.config import EngineConfig, FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.pdproxy.__main__ import duration
from epp_sim.pdproxy.proxy import PREFILLER_HEADER, PdProxy, ProxyConfig, prefill_body
from epp_sim.rank import listen_socket

PROMPT = "the quick brown fox jumps over the lazy dog " * 40  # ~450 tokens: many full blocks


@dataclass(slots=True)
class PdStack:
    fleet: Fleet
    proxy: PdProxy
    url: str
    http: aiohttp.ClientSession

    @property
    def prefiller(self) -> str:
        return f"127.0.0.1:{self.fleet.replicas[0].port}"

    def engine_state(self, replica: int) -> dict[str, Any]:
        return self.fleet.rank(replica).engine.snapshot()

    async def chat(
        self, *, stream: bool, prefiller: str | None = None, max_tokens: int = 5, **extra: Any
    ) -> tuple[int, dict[str, str], bytes]:
        body = {
            "model": "mock-model",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "stream": stream,
            **extra,
        }
        headers = {PREFILLER_HEADER: prefiller} if prefiller else {}
        async with self.http.post(self.url + "/v1/chat/completions", json=body, headers=headers) as r:
            return r.status, dict(r.headers), await r.read()


@contextlib.asynccontextmanager
async def pd_stack(
    *, engine: EngineConfig | None = None, overrides: tuple[dict[str, Any], ...] = (), **proxy: Any
) -> AsyncIterator[PdStack]:
    """Replica 0 = a prefill pod, replica 1 = a decode pod behind the proxy."""
    config = FleetConfig(
        replicas=2,
        engine=engine or EngineConfig(time_scale=0.01),
        overrides=({"replica": 0, "role": "prefill"}, {"replica": 1, "role": "decode"}, *overrides),
    )
    async with Fleet(config) as fleet:
        pd = PdProxy(ProxyConfig(vllm_port=fleet.replicas[1].port, port=0, **proxy))
        runner = web.AppRunner(pd.app())
        await runner.setup()
        sock = listen_socket("127.0.0.1", 0)
        await web.SockSite(runner, sock).start()
        try:
            async with aiohttp.ClientSession() as http:
                yield PdStack(fleet, pd, f"http://127.0.0.1:{sock.getsockname()[1]}", http)
        finally:
            await runner.cleanup()


def test_prefill_leg_body_follows_llm_d() -> None:
    body = {
        "model": "m",
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 300,
        "max_completion_tokens": 200,
        "temperature": 0.5,
    }
    leg = prefill_body(body)
    assert leg["stream"] is False and "stream_options" not in leg
    assert leg["max_tokens"] == 1 and leg["max_completion_tokens"] == 1
    assert leg["temperature"] == 0.5
    assert leg["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert body["stream"] is True and body["max_tokens"] == 300  # the original is untouched


def test_durations_read_like_go() -> None:
    assert duration("200ms") == pytest.approx(0.2)
    assert duration("1.5s") == 1.5
    assert duration("2") == 2.0


async def test_a_prefill_pod_answers_the_nixl_handoff(http: aiohttp.ClientSession) -> None:
    async with pd_stack() as pd:
        body = prefill_body({"model": "mock-model", "prompt": PROMPT, "max_tokens": 9})
        async with http.post(f"http://{pd.prefiller}/v1/completions", json=body) as r:
            answer = await r.json()
        params = answer["kv_transfer_params"]
        assert answer["usage"]["completion_tokens"] == 1
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_host"] == "127.0.0.1"
        assert params["remote_port"] == pd.fleet.replicas[0].port
        assert len(params["remote_block_ids"]) == answer["usage"]["prompt_tokens"] // 16
        assert params["remote_engine_id"] and params["remote_request_id"] == answer["id"]
        assert pd.engine_state(0)["prefill_legs"] == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_with_the_header_the_prefiller_prefills_and_the_decoder_decodes(stream: bool) -> None:
    async with pd_stack() as pd:
        status, headers, body = await pd.chat(stream=stream, prefiller=pd.prefiller, max_tokens=6)
        assert status == 200, body
        assert headers["x-pd-prefiller"] == pd.prefiller
        assert headers["x-inference-pod"] == "sim-1"  # the decode leg's answer
        if stream:
            assert body.count(b'"content":"') - 1 == 6  # the role event, then 6 tokens
            assert body.endswith(b"data: [DONE]\n\n")
        else:
            assert orjson.loads(body)["usage"]["completion_tokens"] == 6
        prefill, decode = pd.engine_state(0), pd.engine_state(1)
        assert prefill["prefill_legs"] == 1 and prefill["kv_transfers"] == 0
        assert decode["kv_transfers"] == 1 and decode["prefill_legs"] == 0
        assert pd.proxy.stats.prefill_legs == 1 and pd.proxy.stats.decode_legs == 1
        assert pd.proxy.stats.prefillers == {pd.prefiller: 1}


async def test_first_of_a_comma_list_is_the_prefiller() -> None:
    async with pd_stack() as pd:
        status, headers, _ = await pd.chat(stream=False, prefiller=f"{pd.prefiller}, 127.0.0.1:1")
        assert status == 200
        assert headers["x-pd-prefiller"] == pd.prefiller


async def test_without_the_header_it_is_a_plain_proxy(http: aiohttp.ClientSession) -> None:
    async with pd_stack() as pd:
        status, _, _ = await pd.chat(stream=True)
        assert status == 200
        async with http.get(pd.url + "/v1/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "mock-model"
        async with http.get(pd.url + "/pdproxy/state") as r:
            state = await r.json()
        assert state["prefill_legs"] == 0 and state["plain"] == 1 and state["passthrough"] == 1
        assert pd.engine_state(0)["prefill_legs"] == 0 and pd.engine_state(1)["kv_transfers"] == 0


async def test_cached_tokens_come_from_the_prefiller() -> None:
    async with pd_stack(engine=EngineConfig(time_scale=0.01, enable_prompt_tokens_details=True)) as pd:
        await pd.chat(stream=False, prefiller=pd.prefiller)  # warms the prefill pod's cache only
        status, _, body = await pd.chat(
            stream=True, prefiller=pd.prefiller, stream_options={"include_usage": True}
        )
        assert status == 200
        usage = next(
            orjson.loads(line[6:])["usage"]
            for line in body.split(b"\n")
            if line.startswith(b"data: {") and b'"prompt_tokens_details"' in line
        )
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the prefiller's hit, not the decoder's


async def test_a_prefill_503_is_retried_then_returned() -> None:
    faults = ({"replica": 0, "error_rate": 1.0, "error_status": 503},)
    async with pd_stack(overrides=faults, prefill_max_retries=2, prefill_retry_backoff_s=0.01) as pd:
        status, _, body = await pd.chat(stream=True, prefiller=pd.prefiller)
        assert status == 503
        assert b"error_rate fault" in body
        assert pd.proxy.stats.prefill_retries == 2 and pd.proxy.stats.prefill_failures == 1
        assert pd.engine_state(1)["steps"] == 0  # no decode leg ran


async def test_a_prefill_500_is_not_retried() -> None:
    faults = ({"replica": 0, "error_rate": 1.0},)
    async with pd_stack(overrides=faults, prefill_max_retries=3, prefill_retry_backoff_s=0.01) as pd:
        status, _, _ = await pd.chat(stream=False, prefiller=pd.prefiller)
        assert status == 500
        assert pd.proxy.stats.prefill_retries == 0


async def test_a_retry_after_503_succeeds(http: aiohttp.ClientSession) -> None:
    """A prefiller that is briefly unavailable: the first attempt 503, the retry goes through."""
    calls: list[str] = []
    async with pd_stack(prefill_max_retries=1, prefill_retry_backoff_s=0.01) as pd:

        async def flaky(request: web.Request) -> web.Response:
            calls.append(request.headers["X-Request-Id"])
            if len(calls) == 1:
                return web.Response(status=503, text="warming up")
            async with http.post(f"http://{pd.prefiller}{request.path}", data=await request.read()) as r:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", flaky)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = listen_socket("127.0.0.1", 0)
        await web.SockSite(runner, sock).start()
        try:
            status, _, _ = await pd.chat(stream=False, prefiller=f"127.0.0.1:{sock.getsockname()[1]}")
        finally:
            await runner.cleanup()
        assert status == 200
        assert len(calls) == 2 and calls[0] != calls[1]  # a fresh request id per attempt
        assert pd.engine_state(1)["kv_transfers"] == 1


async def test_an_unreachable_prefiller_is_a_502() -> None:
    async with pd_stack() as pd:
        sock = listen_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        sock.close()  # nothing listens there now
        status, _, body = await pd.chat(stream=True, prefiller=f"127.0.0.1:{port}")
        assert status == 502
        assert b"unreachable" in body


async def test_a_hanging_prefiller_times_out_with_504() -> None:
    faults = ({"replica": 0, "paused": True},)
    async with pd_stack(overrides=faults, prefill_timeout_s=0.3) as pd:
        status, _, body = await pd.chat(stream=True, prefiller=pd.prefiller)
        assert status == 504
        assert b"timed out" in body


@pytest.mark.parametrize("stream", [True, False])
async def test_a_decoder_blocked_waiting_for_kv_fails_clearly(stream: bool) -> None:
    engine = EngineConfig(time_scale=0.01, kv_transfer_timeout_s=20.0)  # 0.2 s of wall time
    faults = ({"replica": 1, "kv_transfer_stall": True},)
    async with pd_stack(engine=engine, overrides=faults) as pd:
        status, _, body = await pd.chat(stream=stream, prefiller=pd.prefiller)
        assert b"KV transfer of" in body and b"did not complete within 20 s" in body
        assert status == (200 if stream else 500)  # a stream has started: the error is its last event
        assert pd.engine_state(1)["kv_transfer_failures"] == 1
