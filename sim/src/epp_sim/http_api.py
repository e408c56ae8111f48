"""The OpenAI-compatible HTTP API of one rank, shaped like vLLM's (aiohttp, orjson, byte templates)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import orjson
import xxhash
from aiohttp import web

from epp_sim.config import SimConfigError
from epp_sim.lora import Adapter
from epp_sim.metrics import CONTENT_TYPE
from epp_sim.sequence import RequestRejected, Seq
from epp_sim.tokens import VOCAB, OutputStream, render_chat, token_ids

STALL_CHECK_S: Final = 0.01  # how often a stalled request re-reads its stall fault

if TYPE_CHECKING:
    from epp_sim.rank import Rank

VOCAB_JSON: Final = tuple(orjson.dumps(word) for word in VOCAB)
_DONE: Final = b"data: [DONE]\n\n"
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_MAX_BODY: Final = 256 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class _BadRequest(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


def _bad(message: str, param: str | None = None) -> _BadRequest:
    return _BadRequest(error_response(400, message, "BadRequestError", param))


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``messages`` (chat completions and Anthropic messages alike), or a 400."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _bad("messages must be a non-empty list of message objects.", "messages")
    return messages


class HttpApi:
    """Routes of one rank. Inference handlers queue a `Seq` in the rank's engine and stream its output."""

    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self._rng = random.Random(rank.engine.config.seed * 7919 + rank.rank)
        self._created = int(time.time())

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY)
        app.on_response_prepare.append(self._identity_headers)
        app.router.add_post("/v1/completions", self._inference(self.completions))
        app.router.add_post("/v1/chat/completions", self._inference(self.chat_completions))
        app.router.add_post("/v1/embeddings", self._inference(self.embeddings))
        app.router.add_post("/v1/messages", self._inference(self.messages))
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions/render", self.render_completions)
        app.router.add_post("/v1/chat/completions/render", self.render_chat)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_lora_adapter)
        app.router.add_get("/sim/state", self.sim_state)
        app.router.add_get("/sim/faults", self.sim_faults)
        app.router.add_post("/sim/faults", self.sim_faults)
        return app

    async def _identity_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-inference-pod"] = self.rank.name
        response.headers["x-inference-port"] = self.rank.port_text

    def _inference(self, handler: Handler) -> Handler:
        """Wrap an inference route: the error_rate fault, vLLM-shaped request errors, busy connections."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            faults = self.rank.faults
            if faults.inference_stall:
                await self._stalled("inference_stall")
            if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
                await request.read()
                return error_response(
                    faults.error_status, "Simulated engine failure (error_rate fault).", "InternalServerError"
                )
            busy = self.rank.busy_transports
            transport = request.transport
            if transport is not None:
                busy.add(transport)
            try:
                return await handler(request)
            except _BadRequest as exc:
                return exc.response
            except RequestRejected as exc:
                return error_response(exc.status, exc.message, exc.err_type)
            finally:
                if transport is not None:
                    busy.discard(transport)

        return wrapped

    # ---- request parsing ----------------------------------------------------------------------

    async def _json(self, request: web.Request) -> dict[str, Any]:
        body = await request.read()
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _bad(f"JSON decode error: {exc}") from None
        if not isinstance(data, dict):
            raise _bad("The request body must be a JSON object.")
        return data

    def _adapter(self, data: dict[str, Any]) -> tuple[str, Adapter | None]:
        """The served model name and its adapter (None for the base model); unknown names are 404."""
        model = data.get("model")
        config = self.rank.engine.config
        if model is None or model == config.model:
            return config.model, None
        if isinstance(model, str) and config.enable_lora:
            adapter = self.rank.registry.get(model)
            if adapter is not None:
                return model, adapter
        raise _BadRequest(
            error_response(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        )

    def _max_tokens(self, data: dict[str, Any], *keys: str) -> int:
        for key in keys:
            value = data.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _bad(f"{key} must be at least 1, got {value}.", key)
            return value
        return self.rank.engine.config.default_max_tokens

    def _seq(
        self,
        request_id: str,
        ids: array[int],
        key: bytes,
        data: dict[str, Any],
        max_tokens: int,
        adapter: Adapter | None,
        *,
        stream: bool,
        embedding: bool = False,
    ) -> Seq:
        n = data.get("n", 1)
        if n != 1:
            raise _bad("The simulator supports only n=1.", "n")
        config = self.rank.engine.config
        salt = data.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise _bad("cache_salt must be a non-empty string.", "cache_salt")
        seq = Seq(
            request_id,
            ids,
            max_tokens=max_tokens,
            ignore_eos=bool(data.get("ignore_eos", False)),
            adapter=adapter,
            embedding=embedding,
            stream=stream,
            sampler=OutputStream(key, config.seed, config.eos_probability),
            cache_salt=salt,
        )
        params = data.get("kv_transfer_params")
        if isinstance(params, dict):
            # NixlConnector: the decode leg pulls the prompt's KV instead of computing it; a prompt
            # shorter than one block has no blocks to pull and is prefilled locally
            seq.remote_prefill = bool(params.get("do_remote_prefill")) and bool(
                params.get("remote_block_ids")
            )
        return seq

    def _request_id(self, request: web.Request) -> str:
        # a seeded 128-bit id: uuid4() would cost a getrandom() syscall per request
        return request.headers.get("X-Request-Id") or f"{self._rng.getrandbits(128):032x}"

    # ---- inference ----------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        data = await self._json(request)
        model, adapter = self._adapter(data)
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids, key = token_ids(prompt), prompt.encode()
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = array("I", prompt)
            key = ids.tobytes()
        else:
            raise _bad("prompt must be a string, a list of token ids, or a list of one of them.", "prompt")
        stream = bool(data.get("stream", False))
        seq = self._seq(
            f"cmpl-{self._request_id(request)}",
            ids,
            key,
            data,
            self._max_tokens(data, "max_tokens"),
            adapter,
            stream=stream,
        )
        return await self._serve(request, seq, data, model, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        data = await self._json(request)
        model, adapter = self._adapter(data)
        messages = _messages(data)
        text = render_chat(messages)
        stream = bool(data.get("stream", False))
        seq = self._seq(
            f"chatcmpl-{self._request_id(request)}",
            token_ids(text),
            text.encode(),
            data,
            self._max_tokens(data, "max_completion_tokens", "max_tokens"),
            adapter,
            stream=stream,
        )
        return await self._serve(request, seq, data, model, chat=True)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API, as vLLM serves it at /v1/messages (non-streamed and SSE)."""
        data = await self._json(request)
        model, adapter = self._adapter(data)
        messages = _messages(data)
        max_tokens = data.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _bad("max_tokens is required and must be a positive integer.", "max_tokens")
        system = data.get("system")
        if isinstance(system, list):
            system = "".join(b.get("text", "") for b in system if isinstance(b, dict))
        turns = ([{"role": "system", "content": system}] if system else []) + messages
        text = render_chat(turns)
        stream = bool(data.get("stream", False))
        seq = self._seq(
            f"msg_{self._request_id(request)}",
            token_ids(text),
            text.encode(),
            data,
            max_tokens,
            adapter,
            stream=stream,
        )
        engine = self.rank.engine
        engine.submit(seq)
        try:
            if stream:
                return await self._stream_messages(request, seq, model)
            while not seq.finished:
                await seq.wait()
        finally:
            if not seq.finished:
                engine.abort(seq)
        if seq.error is not None:
            return error_response(500, seq.error, "InternalServerError")
        body = {
            "id": seq.request_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": "".join(VOCAB[w] for w in seq.output)}],
            "stop_reason": "max_tokens" if seq.finish_reason == "length" else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": seq.prompt_len, "output_tokens": len(seq.output)},
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _stream_messages(self, request: web.Request, seq: Seq, model: str) -> web.StreamResponse:
        """Anthropic's event stream: message_start, content deltas, message_delta (usage), message_stop."""
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)

        def event(name: str, payload: dict[str, Any]) -> bytes:
            return (
                b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **payload}) + b"\n\n"
            )

        start: dict[str, Any] = {
            "id": seq.request_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": seq.prompt_len, "output_tokens": 0},
        }
        await response.write(event("message_start", {"message": start}))
        await response.write(
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        )
        while True:
            await seq.wait()
            while seq.delivered < len(seq.output):
                word = VOCAB[seq.output[seq.delivered]]
                seq.delivered += 1
                delta = {"index": 0, "delta": {"type": "text_delta", "text": word}}
                await response.write(event("content_block_delta", delta))
            if seq.finished:
                break
        await response.write(event("content_block_stop", {"index": 0}))
        stop = "max_tokens" if seq.finish_reason == "length" else "end_turn"
        done = {
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": len(seq.output)},
        }
        await response.write(event("message_delta", done))
        await response.write(event("message_stop", {}))
        await response.write_eof()
        return response

    async def _serve(
        self, request: web.Request, seq: Seq, data: dict[str, Any], model: str, *, chat: bool
    ) -> web.StreamResponse:
        engine = self.rank.engine
        engine.submit(seq)
        try:
            if seq.stream:
                return await self._stream(request, seq, data, model, chat=chat)
            while not seq.finished:
                await seq.wait()
        finally:
            if not seq.finished:
                engine.abort(seq)
        if seq.error is not None:
            return error_response(500, seq.error, "InternalServerError")
        text = "".join(VOCAB[w] for w in seq.output)
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": seq.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": seq.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        body: dict[str, Any] = {
            "id": seq.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": self._usage(seq),
        }
        params = data.get("kv_transfer_params")
        if isinstance(params, dict) and params.get("do_remote_decode"):
            body["kv_transfer_params"] = self._prefill_handoff(seq)
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    def _prefill_handoff(self, seq: Seq) -> dict[str, Any] | None:
        """The prefill leg's answer, shaped like vLLM NixlConnector's `request_finished`: where the
        decode side pulls the prompt's KV from. Only a length-capped request hands off (as vLLM)."""
        if seq.finish_reason != "length":
            return None
        rank = self.rank
        rank.engine.stats.prefill_legs += 1
        bs = rank.engine.config.block_size
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [h & 0x7FFF_FFFF for h in seq.hashes[: seq.prompt_len // bs]],
            "remote_engine_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{rank.url}/{rank.rank}")),
            "remote_request_id": seq.request_id,
            "remote_host": rank.host,
            "remote_port": rank.port,
            "tp_size": 1,
        }

    def _usage(self, seq: Seq) -> dict[str, Any]:
        completion = len(seq.output)
        details = None
        if self.rank.engine.config.enable_prompt_tokens_details:
            details = {"cached_tokens": max(seq.cached_tokens, 0)}
        return {
            "prompt_tokens": seq.prompt_len,
            "total_tokens": seq.prompt_len + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
        }

    async def _stream(
        self, request: web.Request, seq: Seq, data: dict[str, Any], model: str, *, chat: bool
    ) -> web.StreamResponse:
        options = data.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
        continuous = bool(options.get("continuous_usage_stats")) if isinstance(options, dict) else False
        created = int(time.time())
        head = orjson.dumps(
            {
                "id": seq.request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": model,
            }
        )[:-1]
        if chat:
            prefix = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
            tail = b'},"logprobs":null,"finish_reason":'
        else:
            prefix = b"data: " + head + b',"choices":[{"index":0,"text":'
            tail = b',"logprobs":null,"finish_reason":'
        open_end = tail + b'null,"stop_reason":null}]}\n\n'
        # vLLM's chat stream opens with a role event, sent with the first token
        role = b""
        if chat:
            role = b"data: " + head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            role += (
                b'"logprobs":null,"finish_reason":null}]' + self._chunk_usage(seq, 0, continuous) + b"}\n\n"
            )
        output = seq.output
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)  # headers leave now, as vLLM's do, before the first token
        transport = request.transport
        if not continuous and transport is not None:

            def sink(s: Seq) -> bool:
                """Write one new token's event to the socket from inside the engine step: no task
                switch per token. Chunked framing is self-contained, so these writes interleave
                safely with aiohttp's (headers before, the epilogue after)."""
                nonlocal role
                delivered = s.delivered
                if len(output) != delivered + 1 or transport.is_closing():
                    return False  # the handler catches up (several tokens, or a closing socket)
                event = role + prefix + VOCAB_JSON[output[delivered]] + open_end
                try:
                    transport.write(b"%x\r\n%b\r\n" % (len(event), event))
                except (OSError, RuntimeError):
                    return False  # never let a client's socket break the engine loop
                role = b""
                s.delivered = delivered + 1
                return True

            seq.sink = sink
        try:
            pending = b""  # the last token's event goes out with the epilogue, in one write
            while True:
                await seq.wait()
                produced = len(output)
                delivered = seq.delivered
                if delivered < produced:
                    seq.delivered = produced
                    parts = [role]
                    role = b""
                    last = produced - 1 if seq.finished else -1
                    for i in range(delivered, produced):
                        usage = self._chunk_usage(seq, i + 1, continuous)
                        if i == last:
                            end = tail + orjson.dumps(seq.finish_reason) + b',"stop_reason":null}]'
                            parts.append(prefix + VOCAB_JSON[output[i]] + end + usage + b"}\n\n")
                        elif usage:
                            parts.append(prefix + VOCAB_JSON[output[i]] + open_end[:-3] + usage + b"}\n\n")
                        else:
                            parts.append(prefix + VOCAB_JSON[output[i]] + open_end)
                    if not seq.finished:
                        await response.write(b"".join(parts))
                        continue
                    pending = b"".join(parts)
                if seq.finished and seq.delivered == len(output):
                    break
            if seq.error is not None:
                error = {
                    "error": {"message": seq.error, "type": "InternalServerError", "param": None, "code": 500}
                }
                pending += b"data: " + orjson.dumps(error) + b"\n\n"
            elif include_usage:
                usage = orjson.dumps(self._usage(seq))
                pending += b"data: " + head + b',"choices":[],"usage":' + usage + b"}\n\n"
            await response.write_eof(pending + _DONE)
        except ConnectionError:
            pass  # the client went away (or a crash fault aborted the connection)
        finally:
            seq.sink = None
        return response

    def _chunk_usage(self, seq: Seq, completion: int, continuous: bool) -> bytes:
        if not continuous:
            return b""
        usage = {
            "prompt_tokens": seq.prompt_len,
            "total_tokens": seq.prompt_len + completion,
            "completion_tokens": completion,
        }
        return b',"usage":' + orjson.dumps(usage)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        data = await self._json(request)
        model, adapter = self._adapter(data)
        raw = data.get("input")
        inputs: list[str | list[int]]
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)):
            inputs = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, str | list) for x in raw):
            inputs = raw
        else:
            raise _bad("input must be a string, a list of strings, or token ids.", "input")
        request_id = f"embd-{self._request_id(request)}"
        engine = self.rank.engine
        seqs = []
        for item in inputs:
            if isinstance(item, str):
                ids, key = token_ids(item), item.encode()
            else:
                ids = array("I", item)
                key = ids.tobytes()
            seq = self._seq(request_id, ids, key, data, 1, adapter, stream=False, embedding=True)
            engine.submit(seq)
            seqs.append((seq, key))
        try:
            for seq, _ in seqs:
                while not seq.finished:
                    await seq.wait()
        finally:
            for seq, _ in seqs:
                if not seq.finished:
                    engine.abort(seq)
        failed = next((s.error for s, _ in seqs if s.error is not None), None)
        if failed is not None:
            return error_response(500, failed, "InternalServerError")
        dim = engine.config.embedding_dim
        prompt_tokens = sum(s.prompt_len for s, _ in seqs)
        body = {
            "id": request_id,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": [
                {"index": i, "object": "embedding", "embedding": embedding_vector(key, dim)}
                for i, (_, key) in enumerate(seqs)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    # ---- tokenizer and prefix cache -----------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's POST /tokenize: ``prompt`` (completion) or ``messages`` (chat, rendered with the
        chat template first) → ``{"count", "max_model_len", "tokens", "token_strs"}``."""
        try:
            data = await self._json(request)
            self._adapter(data)
            if "messages" in data:
                messages = data["messages"]
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    raise _bad("messages must be a list of message objects.", "messages")
                ids = token_ids(render_chat(messages)) if messages else array("I")
            else:
                prompt = data.get("prompt")
                if not isinstance(prompt, str):
                    raise _bad("prompt must be a string.", "prompt")
                ids = token_ids(prompt)
        except _BadRequest as exc:
            return exc.response
        tokens = ids.tolist()
        body = {
            "count": len(tokens),
            "max_model_len": self.rank.engine.config.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def render_completions(self, request: web.Request) -> web.Response:
        """vLLM's POST /v1/completions/render (what `vllm launch render` serves): the prompt's
        token ids without running it, one entry per prompt: ``[{"request_id", "token_ids"}]``."""
        try:
            data = await self._json(request)
            prompt = data.get("prompt")
            prompts = (
                prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
            )
            if not all(isinstance(p, str) for p in prompts):
                raise _bad("prompt must be a string or a list of strings.", "prompt")
        except _BadRequest as exc:
            return exc.response
        body = [
            {"request_id": f"render-{i}", "token_ids": token_ids(p).tolist()} for i, p in enumerate(prompts)
        ]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def render_chat(self, request: web.Request) -> web.Response:
        """vLLM's POST /v1/chat/completions/render: the chat template applied and tokenised,
        ``{"request_id", "token_ids"}``."""
        try:
            data = await self._json(request)
            messages = data.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise _bad("messages must be a list of message objects.", "messages")
        except _BadRequest as exc:
            return exc.response
        ids = token_ids(render_chat(messages)).tolist() if messages else []
        body = {"request_id": "render-chat", "token_ids": ids}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's POST /reset_prefix_cache: AllBlocksCleared when no request holds blocks."""
        if not self.rank.engine.reset_prefix_cache():
            return error_response(
                400, "Failed to reset prefix cache: requests are running.", "BadRequestError"
            )
        return web.Response(status=200)

    # ---- models, health, metrics, adapters ----------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        config = self.rank.engine.config

        def card(model_id: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
            permission = {
                "id": f"modelperm-{self._rng.getrandbits(128):032x}",
                "object": "model_permission",
                "created": self._created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
            return {
                "id": model_id,
                "object": "model",
                "created": self._created,
                "owned_by": "vllm",
                "root": root,
                "parent": parent,
                "max_model_len": max_len,
                "permission": [permission],
            }

        cards = [card(config.model, config.model, None, config.max_model_len)]
        if config.enable_lora:
            cards += [card(a.name, a.path, config.model, None) for a in self.rank.registry.adapters()]
        return web.Response(
            body=orjson.dumps({"object": "list", "data": cards}), content_type="application/json"
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.rank.faults.unhealthy else 200)

    async def metrics(self, request: web.Request) -> web.Response:
        faults = self.rank.faults
        if faults.metrics_stall:
            await self._stalled("metrics_stall")
        if faults.metrics_delay_s > 0:
            await asyncio.sleep(faults.metrics_delay_s)  # a slow /metrics is the fault being simulated
        if faults.metrics_status != 200:
            return web.Response(status=faults.metrics_status, text="simulated /metrics failure")
        body = self.rank.renderer.render(self.rank.engine)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _stalled(self, fault: str) -> None:
        """Hold a request while the stall fault ``fault`` is set: accepted, never answered, as by a
        hung process; once the fault is cleared the request goes on, as after SIGCONT.

        The fault is a plain flag flipped by /sim/faults, so it is re-read every ``STALL_CHECK_S``.
        """
        faults = self.rank.faults
        while getattr(faults, fault):  # noqa: ASYNC110 - a plain flag that rank.set_faults flips
            await asyncio.sleep(STALL_CHECK_S)

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        if not self.rank.engine.config.enable_lora:
            raise web.HTTPNotFound()
        try:
            data = await self._json(request)
        except _BadRequest as exc:
            return exc.response
        name, path = data.get("lora_name"), data.get("lora_path")
        if not name or not path:
            return error_response(
                400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"
            )
        registry = self.rank.registry
        if registry.get(name) is not None:
            return error_response(
                400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput"
            )
        registry.load(str(name), str(path))
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        if not self.rank.engine.config.enable_lora:
            raise web.HTTPNotFound()
        try:
            data = await self._json(request)
        except _BadRequest as exc:
            return exc.response
        name = data.get("lora_name")
        if not name:
            return error_response(
                400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput"
            )
        if not self.rank.registry.unload(str(name)):
            return error_response(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # ---- simulator admin ----------------------------------------------------------------------

    async def sim_state(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.rank.state()), content_type="application/json")

    async def sim_faults(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                changes = await self._json(request)
                await self.rank.set_faults(changes)
            except _BadRequest as exc:
                return exc.response
            except SimConfigError as exc:
                return error_response(400, str(exc), "BadRequestError")
        return web.Response(body=orjson.dumps(self.rank.faults.as_dict()), content_type="application/json")


def embedding_vector(key: bytes, dim: int) -> list[float]:
    """A deterministic unit vector for the input: equal inputs embed equally."""
    state = xxhash.xxh3_64_intdigest(key) or 1
    values = []
    for _ in range(dim):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFF_FFFF_FFFF_FFFF
        values.append((state >> 11) / float(1 << 53) * 2.0 - 1.0)
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]
