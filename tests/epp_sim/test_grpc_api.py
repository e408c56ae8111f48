"""Tests of the vLLM gRPC engine API (Generate, Embed and the informational calls)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.rank import Rank
from epp_sim.tokens import count_tokens
from tests.epp_sim.helpers import engine_config

PROMPT = "What is the capital of France? Answer in one word."


@pytest.fixture
async def rank() -> AsyncIterator[Rank]:
    async with Fleet(FleetConfig(grpc_base_port=0, engine=engine_config(max_model_len=1000))) as fleet:
        yield fleet.rank(0)


@pytest.fixture
async def stub(rank: Rank) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{rank.grpc_port}") as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


def generate_request(stream: bool, max_tokens: int = 4, **kwargs: Any) -> Any:
    params = vllm_engine_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return vllm_engine_pb2.GenerateRequest(request_id="r1", sampling_params=params, stream=stream, **kwargs)


async def test_generate_unary_reports_usage_and_identity(rank: Rank, stub: Any) -> None:
    """A non-streamed Generate yields one GenerateComplete with exact counts; metadata names the replica."""
    call = stub.Generate(generate_request(stream=False, text=PROMPT))
    responses = [r async for r in call]
    metadata = dict(await call.initial_metadata())
    assert (metadata["x-inference-pod"], metadata["x-inference-port"]) == ("sim-0", str(rank.grpc_port))
    (response,) = responses
    complete = response.complete
    assert (complete.prompt_tokens, complete.completion_tokens, len(complete.output_ids)) == (
        count_tokens(PROMPT),
        4,
        4,
    )
    assert complete.finish_reason == "length"


async def test_generate_streams_chunks_then_complete(stub: Any) -> None:
    """A streamed Generate yields chunks of new tokens (several when the reader lags, as vLLM merges
    deltas) with running counts, then GenerateComplete."""
    responses = [r async for r in stub.Generate(generate_request(stream=True, max_tokens=5, text=PROMPT))]
    chunks, last = responses[:-1], responses[-1]
    assert [r.WhichOneof("response") for r in responses] == ["chunk"] * len(chunks) + ["complete"]
    assert sum(len(c.chunk.token_ids) for c in chunks) == 5
    counts = [c.chunk.completion_tokens for c in chunks]
    assert counts == sorted(set(counts))
    assert counts[-1] == 5
    assert (last.complete.completion_tokens, last.complete.finish_reason) == (5, "length")


async def test_tokenized_input_uses_the_ids_and_caches_them(stub: Any) -> None:
    """Pre-tokenized input is used as given, so a repeated id prefix hits the prefix cache."""
    tokenized = vllm_engine_pb2.TokenizedInput(original_text="ignored", input_ids=list(range(100, 180)))
    first = [r async for r in stub.Generate(generate_request(stream=False, tokenized=tokenized))][-1]
    second = [r async for r in stub.Generate(generate_request(stream=False, tokenized=tokenized))][-1]
    assert (first.complete.prompt_tokens, first.complete.cached_tokens) == (80, 0)
    assert second.complete.cached_tokens == 64


async def test_embed(stub: Any) -> None:
    """Embed answers a deterministic unit vector and the prompt's token count."""
    request = vllm_engine_pb2.EmbedRequest(
        request_id="e1", tokenized=vllm_engine_pb2.TokenizedInput(original_text=PROMPT)
    )
    response = await stub.Embed(request)
    again = await stub.Embed(request)
    assert (response.prompt_tokens, response.embedding_dim, len(response.embedding)) == (
        count_tokens(PROMPT),
        32,
        32,
    )
    assert list(response.embedding) == list(again.embedding)


async def test_informational_calls(stub: Any) -> None:
    """HealthCheck, GetModelInfo and GetServerInfo describe the simulated engine."""
    health = await stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest())
    model = await stub.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest())
    server = await stub.GetServerInfo(vllm_engine_pb2.GetServerInfoRequest())
    assert health.healthy
    assert (model.served_model_name, model.max_context_length) == ("mock-model", 1000)
    assert (server.server_type, server.block_size, server.data_parallel_size) == ("vllm-grpc", 16, 1)


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param("too-long", grpc.StatusCode.INVALID_ARGUMENT, id="too-long-prompt"),
        pytest.param("flush", grpc.StatusCode.UNIMPLEMENTED, id="unimplemented-method"),
    ],
)
async def test_grpc_errors(stub: Any, call: str, code: grpc.StatusCode) -> None:
    """Impossible requests fail with INVALID_ARGUMENT; methods the simulator lacks are UNIMPLEMENTED."""

    async def attempt() -> None:
        if call == "too-long":
            [r async for r in stub.Generate(generate_request(stream=False, text="x" * 8000))]
        else:
            await stub.FlushCache(common_pb2.FlushCacheRequest())

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await attempt()
    assert caught.value.code() == code
