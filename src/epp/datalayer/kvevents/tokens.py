"""The token ids the engine will see for a request, obtained one of two ways.

* ``LocalTokenizer``: the model's ``tokenizer.json`` through HuggingFace ``tokenizers`` (the
  ``epp[tokenizers]`` extra), in process.  Chat messages are rendered first with a ChatML
  template (``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n``), which is the simulator's template and Qwen's; a model with
  another chat template needs the server route below to get exact ids for chat requests.
* ``ServerTokenizer``: the model server's own vLLM ``POST /tokenize`` (``prompt`` for
  completions, ``messages`` for chat, rendered by the engine's own chat template, so exact for
  any model), one HTTP round trip per request to one of the candidate endpoints.

Pre-tokenized prompts (token-id completions, gRPC) are used as they are.  docs/precise-prefix.md
has the measured cost of each.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import orjson

from epp.datalayer.api import Endpoint
from epp.datalayer.http_client import ScrapeClient
from epp.plugin.keys import AttributeKey
from epp.request import ApiKind, InferenceRequest

_IDLE_PER_HOST: Final = 32  # keep-alive connections kept per engine (one per concurrent call)
_MAX_CONCURRENT: Final = 100  # calls in flight at once, over all engines (aiohttp's pool limit)
_MAX_REPLY_BYTES: Final = 64 << 20  # a 1M-token prompt's ids as JSON


# Orders the readers of the prompt's token ids (``RequestBody.token_ids``) after a ``token-producer``
# that writes them; nothing is stored under it (the ids are on the body, where every reader looks).
TOKENIZED_PROMPT: Final = AttributeKey("TokenizedPrompt", list)


class TokenSource(Protocol):
    async def token_ids(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        """The request's prompt token ids, or None when they cannot be had."""
        ...


def _text_content(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def render_chatml(messages: Iterable[Mapping[str, Any]]) -> str:
    """ChatML rendering with the generation prompt, as the simulator (and Qwen) template it."""
    parts = [
        f"<|im_start|>{m.get('role', 'user')}\n{_text_content(m.get('content'))}<|im_end|>\n"
        for m in messages
    ]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def chat_messages(request: InferenceRequest) -> list[dict[str, Any]] | None:
    """The chat turns of a chat or Anthropic messages request (the system prompt first), else None."""
    body = request.body
    if body is None or body.json is None:
        return None
    doc = body.json
    messages = doc.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    if body.api is ApiKind.MESSAGES:
        system = doc.get("system")
        if system:
            return [{"role": "system", "content": _text_content(system)}, *messages]
        return list(messages)
    if body.api is ApiKind.CHAT_COMPLETIONS:
        return list(messages)
    return None


def prompt_text(request: InferenceRequest) -> str | None:
    """The prompt of a completions-like request as text, else None."""
    body = request.body
    if body is None:
        return None
    if body.api is ApiKind.COMPLETIONS and body.json is not None:
        prompt = body.json.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else None
    return body.prompt_text


def given_ids(request: InferenceRequest) -> list[int] | None:
    """Token ids the client sent itself (token-id completions, gRPC tokenized)."""
    body = request.body
    if body is None:
        return None
    if body.token_ids:
        return list(body.token_ids)
    if body.api is ApiKind.COMPLETIONS and body.json is not None:
        prompt = body.json.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return prompt
    return None


_THREAD_CHARS = 4096  # longer texts are encoded on a worker thread (tokenizers releases the GIL)


class LocalTokenizer:
    """``tokenizers.Tokenizer.from_file(path)``.  Short texts are encoded on the event loop; longer
    ones (a 2,000-token prompt costs milliseconds, docs/precise-prefix.md) on a worker thread, so the
    loop keeps serving while the Rust encoder runs without the GIL."""

    def __init__(self, path: str, *, add_special_tokens: bool = True) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - the extra is part of dev
            raise ValueError(
                "a local tokenizer needs the 'tokenizers' package: pip install 'epp[tokenizers]'"
            ) from e
        self.path = path
        self._tokenizer = Tokenizer.from_file(path)
        self._special = add_special_tokens

    def encode(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        special = self._special if add_special_tokens is None else add_special_tokens
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=special).ids
        return ids

    async def token_ids(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        ids = given_ids(request)
        if ids is not None:
            return ids
        messages = chat_messages(request)
        special: bool | None = None
        if messages is not None:
            # the chat template carries its own special tokens: vLLM adds none (add_special_tokens=False)
            text: str | None = render_chatml(messages)
            special = False
        else:
            text = prompt_text(request)
        if text is None:
            return None
        if len(text) > _THREAD_CHARS:
            return await asyncio.to_thread(self.encode, text, add_special_tokens=special)
        return self.encode(text, add_special_tokens=special)


# Chat fields that change what the engine's template renders: passed through to /tokenize.
TEMPLATE_FIELDS = (
    "tools", "documents", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message",
)  # fmt: skip


class ServerTokenizer:
    """vLLM's ``POST /tokenize`` on one of the candidates (all serve the same model), taken in
    turn so no engine carries every request's tokenisation.

    One call per routed request, so it goes through the data layer's lean keep-alive client
    (``http_client.ScrapeClient.post``) rather than a general one: 0.25 ms of EPP CPU per call
    with aiohttp's, measured under the shared-prefix benchmark at 48 req/s."""

    def __init__(
        self, *, timeout: float = 1.0, scheme: str = "http", max_concurrent: int = _MAX_CONCURRENT
    ) -> None:
        self._timeout = timeout
        # a burst of requests waits for a slot (within its timeout) rather than opening a
        # connection each to the engines
        self._slots = asyncio.Semaphore(max_concurrent)
        self._client = ScrapeClient(
            ssl_context=ssl.create_default_context() if scheme == "https" else None,
            max_idle_per_host=_IDLE_PER_HOST,
            max_body_bytes=_MAX_REPLY_BYTES,
        )
        self._turn = 0

    async def close(self) -> None:
        await self._client.close()

    async def token_ids(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        ids = given_ids(request)
        if ids is not None:
            return ids
        if not endpoints:
            return None
        body: dict[str, Any]
        messages = chat_messages(request)
        if messages is not None:
            body = {"messages": messages, "add_generation_prompt": True}
            doc = request.body.json if request.body is not None and request.body.json is not None else {}
            for key in TEMPLATE_FIELDS:
                if key in doc:
                    body[key] = doc[key]
        else:
            text = prompt_text(request)
            if text is None:
                return None
            body = {"prompt": text}
        model = request.target_model or (request.body.model if request.body is not None else "")
        if model:
            body["model"] = model
        self._turn += 1
        md = endpoints[self._turn % len(endpoints)].metadata
        async with asyncio.timeout(self._timeout), self._slots:
            status, reply = await self._client.post(md.address, md.port, "/tokenize", orjson.dumps(body))
        if status != 200:
            return None
        doc = orjson.loads(reply)
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        return tokens if isinstance(tokens, list) else None
