"""vLLM's gRPC engine API (smg-grpc-proto `vllm.grpc.engine.VllmEngine`): Generate, Embed and friends."""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from epp_sim.http_api import embedding_vector
from epp_sim.sequence import RequestRejected, Seq
from epp_sim.tokens import VOCAB_IDS, OutputStream, token_ids

if TYPE_CHECKING:
    from epp_sim.rank import Rank

SERVICE: Final = "vllm.grpc.engine.VllmEngine"


class GrpcApi:
    """Servicer of one rank; methods not listed in `handler()` answer UNIMPLEMENTED."""

    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self._active: dict[str, Seq] = {}
        self._started = time.time()
        self._rng = random.Random(rank.engine.config.seed * 104_729 + rank.rank)

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, request: Any, response: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
            )

        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.generate,
                request_deserializer=pb.GenerateRequest.FromString,
                response_serializer=pb.GenerateResponse.SerializeToString,
            ),
            "Embed": unary(self.embed, pb.EmbedRequest, pb.EmbedResponse),
            "HealthCheck": unary(self.health_check, pb.HealthCheckRequest, pb.HealthCheckResponse),
            "Abort": unary(self.abort, pb.AbortRequest, pb.AbortResponse),
            "GetModelInfo": unary(self.get_model_info, pb.GetModelInfoRequest, pb.GetModelInfoResponse),
            "GetServerInfo": unary(self.get_server_info, pb.GetServerInfoRequest, pb.GetServerInfoResponse),
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    async def _start(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        rank = self.rank
        await context.send_initial_metadata(
            (("x-inference-pod", rank.name), ("x-inference-port", str(rank.grpc_port)))
        )
        faults = rank.faults
        if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
            await context.abort(grpc.StatusCode.INTERNAL, "Simulated engine failure (error_rate fault).")

    @staticmethod
    def _ids(tokenized: Any, text: str) -> tuple[array[int], bytes]:
        if tokenized is not None and tokenized.input_ids:
            ids = array("I", tokenized.input_ids)
            return ids, ids.tobytes()
        if tokenized is not None:
            text = tokenized.original_text
        return token_ids(text), text.encode()

    async def generate(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await self._start(context)
        engine = self.rank.engine
        config = engine.config
        tokenized = request.tokenized if request.WhichOneof("input") == "tokenized" else None
        ids, key = self._ids(tokenized, request.text)
        params = request.sampling_params
        max_tokens = params.max_tokens if params.HasField("max_tokens") else config.default_max_tokens
        request_id = request.request_id or f"{self._rng.getrandbits(128):032x}"
        seq = Seq(
            request_id,
            ids,
            max_tokens=max(1, max_tokens),
            ignore_eos=params.ignore_eos,
            stream=request.stream,
            sampler=OutputStream(key, config.seed, config.eos_probability),
        )
        try:
            engine.submit(seq)
        except RequestRejected as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        self._active[request_id] = seq
        try:
            while True:
                await seq.wait()
                produced = len(seq.output)
                if request.stream and seq.delivered < produced:
                    new = [VOCAB_IDS[w] for w in seq.output[seq.delivered : produced]]
                    seq.delivered = produced
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=new,
                            prompt_tokens=seq.prompt_len,
                            completion_tokens=produced,
                            cached_tokens=max(seq.cached_tokens, 0),
                        )
                    )
                if seq.finished and (seq.delivered == len(seq.output) or not request.stream):
                    break
            if seq.error is not None:
                await context.abort(grpc.StatusCode.INTERNAL, seq.error)
            yield pb.GenerateResponse(
                complete=pb.GenerateComplete(
                    output_ids=[] if request.stream else [VOCAB_IDS[w] for w in seq.output],
                    finish_reason=seq.finish_reason or "abort",
                    prompt_tokens=seq.prompt_len,
                    completion_tokens=len(seq.output),
                    cached_tokens=max(seq.cached_tokens, 0),
                )
            )
        finally:
            self._active.pop(request_id, None)
            if not seq.finished:
                engine.abort(seq)

    async def embed(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await self._start(context)
        engine = self.rank.engine
        config = engine.config
        ids, key = self._ids(request.tokenized, "")
        seq = Seq(
            request.request_id or f"{self._rng.getrandbits(128):032x}",
            ids,
            max_tokens=1,
            embedding=True,
            sampler=OutputStream(key, config.seed, 0.0),
        )
        try:
            engine.submit(seq)
        except RequestRejected as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        try:
            while not seq.finished:
                await seq.wait()
        finally:
            if not seq.finished:
                engine.abort(seq)
        if seq.error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, seq.error)
        return pb.EmbedResponse(
            embedding=embedding_vector(key, config.embedding_dim),
            prompt_tokens=seq.prompt_len,
            embedding_dim=config.embedding_dim,
        )

    async def health_check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        healthy = not self.rank.faults.unhealthy
        return pb.HealthCheckResponse(healthy=healthy, message="ok" if healthy else "unhealthy (fault)")

    async def abort(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        for request_id in request.request_ids:
            seq = self._active.get(request_id)
            if seq is not None:
                self.rank.engine.abort(seq)
        return pb.AbortResponse()

    async def get_model_info(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        config = self.rank.engine.config
        return pb.GetModelInfoResponse(
            model_path=config.model,
            is_generation=True,
            max_context_length=config.max_model_len,
            served_model_name=config.model,
            tokenizer_path=config.model,
            model_type="simulated",
            max_req_input_len=config.max_model_len,
        )

    async def get_server_info(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rank = self.rank
        engine = rank.engine
        return pb.GetServerInfoResponse(
            active_requests=len(engine.running) + len(engine.waiting),
            is_paused=rank.faults.paused,
            uptime_seconds=time.time() - self._started,
            server_type="vllm-grpc",
            data_parallel_size=rank.dp_size,
            block_size=engine.config.block_size,
            max_num_seqs=engine.config.max_num_seqs,
        )
