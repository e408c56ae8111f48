"""Issue 2: requests flow client → Envoy → (ext_proc) EPP → the replica the EPP chose → back."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.e2e.conftest import Stack, make_stack

# One event loop for the module, so that the module's one stack (below) serves all its tests.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """One default stack for this module's tests that use it: each sends a few requests and checks
    what came back or the EPP's own view, none changes the stack, and starting one per test (the
    three processes) cost more than the tests themselves."""
    async with make_stack(tmp_path_factory.mktemp("stack")) as s:
        yield s


MODEL = "mock-model"


def assert_served_by_choice(reply: object) -> None:
    from tests.e2e.conftest import Reply

    assert isinstance(reply, Reply)
    assert reply.status == 200, reply.body[:300]
    assert reply.epp_choice, reply.headers
    assert reply.epp_choice == reply.served_by


async def test_completions_chat_and_get_reach_the_chosen_replica(stack: Stack) -> None:
    """Non-streamed completions and chat, and a GET, are answered by the replica the EPP picked."""
    r = await stack.post("/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 4})
    assert_served_by_choice(r)
    assert r.json()["usage"]["completion_tokens"] == 4
    r = await stack.post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert_served_by_choice(r)
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    r = await stack.request("GET", "/v1/models")
    assert_served_by_choice(r)
    assert r.json()["data"][0]["id"] == MODEL


async def test_sse_streaming_passes_through_chunk_by_chunk(stack: Stack) -> None:
    """A streamed completion arrives as SSE events, usage last, then [DONE], from the chosen replica."""
    body = {
        "model": MODEL,
        "prompt": "stream me",
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with stack.http.post(stack.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-epp-destination"] == f"127.0.0.1:{r.headers['x-inference-port']}"
        events = [line async for line in r.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]"
    assert b'"usage"' in events[-2] and b'"completion_tokens":8' in events[-2]
    assert len(events) >= 9  # eight token events, the usage event, [DONE]


async def test_large_body_and_split_body(stack: Stack) -> None:
    """A 400 KB prompt and a body sent in small chunks both route and arrive intact."""
    prompt = "x" * 400_000
    r = await stack.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert_served_by_choice(r)
    assert r.json()["usage"]["prompt_tokens"] == 100_000  # 4 characters per token: every byte arrived

    payload = b'{"model": "mock-model", "prompt": "' + b"split " * 2000 + b'", "max_tokens": 2}'

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]
            await asyncio.sleep(0)

    r = await stack.request(
        "POST", "/v1/completions", data=chunks(), headers={"content-type": "application/json"}
    )
    assert_served_by_choice(r)
    assert r.json()["usage"]["prompt_tokens"] == len(b"split " * 2000) // 4


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        pytest.param(b"no healthy upstream", 400, b"inference error: BadRequest - error unmarshaling request bodyMap", id="bad-json"),
        pytest.param(b'{"prompt":"hello"}', 400, b"inference error: BadRequest - model not found in request body", id="no-model"),
        pytest.param(b'{"model":"mock-model"}', 400, b"invalid completions request: must have prompt field", id="no-prompt"),
    ],
)  # fmt: skip
async def test_bad_requests_get_gie_errors_and_the_server_keeps_serving(
    stack: Stack, body: bytes, status: int, text: bytes
) -> None:
    """Bad input is answered with GIE's status and text; the next request is served normally."""
    r = await stack.request(
        "POST", "/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    assert r.status == status
    assert text in r.body
    r = await stack.post("/v1/completions", {"model": MODEL, "prompt": "still fine", "max_tokens": 1})
    assert_served_by_choice(r)


async def test_oversized_body_is_413(tmp_path: pathlib.Path) -> None:
    """A body above --max-request-body-bytes is refused with 413 before it is buffered whole."""
    async with make_stack(tmp_path, epp_args=["--max-request-body-bytes=100000"]) as s:
        r = await s.post("/v1/completions", {"model": MODEL, "prompt": "y" * 200_000})
        assert r.status == 413
        assert b"inference error: PayloadTooLarge" in r.body
        assert_served_by_choice(
            await s.post("/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 1})
        )


async def test_dead_replica_stops_receiving_traffic(tmp_path: pathlib.Path) -> None:
    """A replica that crashes: once its metrics age out it gets no more requests; others serve all."""
    async with make_stack(tmp_path, epp_args=["--metrics-staleness-threshold=300ms"]) as s:
        await s.sim_faults(0, crashed=True)
        dead = s.fleet.hostports[0]
        await asyncio.sleep(0.6)  # let the dead replica's last scrape age past the threshold
        replies = [
            await s.post("/v1/completions", {"model": MODEL, "prompt": f"p{i}", "max_tokens": 1})
            for i in range(12)
        ]
        assert all(r.status == 200 for r in replies), [r.status for r in replies]
        assert dead not in {r.served_by for r in replies}


async def test_metrics_endpoint_serves_gie_series(stack: Stack) -> None:
    """After traffic, /metrics has GIE's request and pool series with GIE's labels."""
    await stack.post("/v1/completions", {"model": MODEL, "prompt": "count me", "max_tokens": 2})
    text = await stack.epp_metrics()
    for name in (
        "inference_objective_request_total",
        "inference_objective_request_duration_seconds_bucket",
        "inference_objective_input_tokens_bucket",
        "inference_extension_scheduler_e2e_duration_seconds_bucket",
        "inference_extension_plugin_duration_seconds_bucket",
        "inference_pool_per_pod_queue_size",
        "inference_extension_info",
    ):
        assert name in text, name
    assert (
        'inference_objective_request_total{model_name="mock-model",priority="0",target_model_name="mock-model"}'
        in text
    )


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_tls_between_envoy_and_the_epp(tmp_path: pathlib.Path, transport: str) -> None:
    """GIE's default: --secure-serving with a self-signed certificate, Envoy speaking TLS (ALPN h2)."""
    args = ["--secure-serving=true", f"--ext-proc-transport={transport}"]
    async with make_stack(tmp_path, epp_args=args, envoy={"ext_proc_tls": True}) as s:
        assert '"secure_serving":true' in s.epp.log_tail()  # the later flag won; SERVING only once listening
        for _ in range(3):
            assert_served_by_choice(
                await s.post("/v1/completions", {"model": MODEL, "prompt": "tls", "max_tokens": 3})
            )
        body = {"model": MODEL, "prompt": "s", "max_tokens": 5, "stream": True}
        async with s.http.post(s.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert (await r.text()).rstrip().endswith("data: [DONE]")


async def test_lean_mode_skips_response_bodies_unless_needed(tmp_path: pathlib.Path) -> None:
    """With BUFFERED request bodies, STREAMED response bodies and allow_mode_override, the EPP asks
    Envoy not to send responses it does not need: two ext_proc messages per request instead of one
    per chunk.  A model rewrite (the client's name must be restored) keeps the response flowing."""
    envoy = {"request_body_mode": "BUFFERED", "response_body_mode": "STREAMED", "allow_mode_override": True,
             "buffer_limit_bytes": 1 << 20}  # fmt: skip
    async with make_stack(tmp_path, envoy=envoy) as s:
        body = {"model": MODEL, "prompt": "lean", "max_tokens": 12, "stream": True}
        before = (await s.envoy.stats())["http.inference.ext_proc.stream_msgs_sent"]
        for _ in range(5):
            r = await s.post("/v1/completions", body)
            assert r.status == 200 and r.body.rstrip().endswith(b"data: [DONE]")
        lean = (await s.envoy.stats())["http.inference.ext_proc.stream_msgs_sent"] - before
        assert lean == 5 * 2  # request headers + request body, nothing of the 14-event responses

        aliased = {**body, "model": "client-alias"}
        r = await s.post("/v1/completions", aliased, headers={"x-gateway-model-name-rewrite": MODEL})
        assert r.status == 200 and b'"model":"client-alias"' in r.body  # restored in every chunk
        full = (await s.envoy.stats())["http.inference.ext_proc.stream_msgs_sent"] - before - lean
        assert full > 3  # response headers and body chunks (Envoy coalesces STREAMED chunks) reached the EPP


async def test_emit_endpoint_scores_reaches_envoys_metadata(tmp_path: pathlib.Path) -> None:
    """With --emit-endpoint-scores every candidate's score rides in envoy.lb (Envoy's access log shows it)."""
    import orjson

    async with make_stack(tmp_path, epp_args=["--emit-endpoint-scores"]) as s:
        r = await s.post("/v1/completions", {"model": MODEL, "prompt": "explain me", "max_tokens": 2})
        assert r.status == 200
        line = await s.access_log_line("/v1/completions")
        scores = orjson.loads(line.split("scores=", 1)[1])
        assert set(scores) == set(s.fleet.hostports)
        assert r.epp_choice in scores and scores[r.epp_choice] == max(scores.values())


async def test_debug_plugins_state_shows_endpoints_and_plugin_state(stack: Stack) -> None:
    """/debug/plugins/state on the metrics port: every endpoint's metrics, age, health and scrape
    loop, the plugins' own state (the prefix index grows once a request went through), the
    saturation detectors' verdicts and (null without the flowControl gate) the queues."""
    r = await stack.post("/v1/completions", {"model": MODEL, "prompt": "state me " * 40, "max_tokens": 2})
    assert r.status == 200
    async with stack.http.get(f"http://127.0.0.1:{stack.epp.metrics_port}/debug/plugins/state") as resp:
        assert resp.status == 200
        state = await resp.json()
    assert {e["address"] for e in state["endpoints"]} == set(stack.fleet.hostports)
    for e in state["endpoints"]:
        assert e["health"]["available"] and e["scrape"]["ticks"] > 0
        assert e["metricsAgeSeconds"] is not None and e["metricsAgeSeconds"] < 5
    prefix = [v for k, v in state["plugins"].items() if "prefix" in k]
    assert prefix and prefix[0]["entries"] > 0
    assert prefix[0]["hitRate"]["requests"] > 0 and prefix[0]["hitRate"]["blocksLookedUp"] > 0
    assert state["pool"]["synced"] is True
    saturation = state["saturation"]
    assert saturation["detector"] in saturation["detectors"]
    assert saturation["detectors"][saturation["detector"]]["saturated"] is False  # one request, idle fleet
    assert state["flowControl"] is None  # the default config admits without flow control
