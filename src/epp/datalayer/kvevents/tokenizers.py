"""Tokenizers as llm-d configures them: a vLLM render endpoint, a UDS tokenizer service, a local or
HuggingFace-cached ``tokenizer.json``.  Each is a ``tokens.TokenSource``.

* ``RenderTokenizer`` (llm-d-router ``token-producer`` ``vllm``): ``POST {url}/v1/completions/render``
  and ``/v1/chat/completions/render`` with the request's own body and ``model`` set to
  ``modelName`` (``vllm serve`` and the GPU-less ``vllm launch render`` serve both).  A server that
  answers 404 there (a vLLM before the render API, the simulator's older builds) is asked on its
  ``POST /tokenize`` from then on.  Per-request failures return None: the caller estimates instead.
* ``UdsTokenizer`` (``udsTokenizerConfig``, deprecated upstream): llm-d-kv-cache's gRPC
  ``tokenization.TokenizationService`` on a Unix socket (``useTCP``: host:port, for tests).
  ``start`` calls ``InitializeTokenizer`` as upstream does (5 attempts, 0-4 s apart) and raises
  when the service cannot be reached or refuses the model: a configured sidecar that is not
  there is a startup error, upstream's behaviour.
* ``find_local`` / ``find_hf_cached`` (``local`` / ``hf``): where a model's ``tokenizer.json`` is,
  by llm-d-kv-cache's rules (``modelTokenizerMap`` first, then auto-discovery under a directory:
  the HuggingFace cache layout ``models--org--name/snapshots/*/`` names ``org/name``, any other
  directory its path).  Loaded with ``tokens.LocalTokenizer``.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import grpc
import grpc.aio
import orjson
import structlog

from epp.datalayer.api import Endpoint
from epp.datalayer.http_client import ScrapeClient
from epp.datalayer.kvevents import tokenizer_pb as pb
from epp.datalayer.kvevents.tokens import (
    TEMPLATE_FIELDS,
    LocalTokenizer,
    chat_messages,
    given_ids,
    prompt_text,
)
from epp.errors import ConfigError
from epp.request import ApiKind, InferenceRequest

log = structlog.get_logger(__name__)

COMPLETIONS_RENDER: Final = "/v1/completions/render"
CHAT_RENDER: Final = "/v1/chat/completions/render"
_MAX_REPLY_BYTES: Final = 64 << 20
_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, field: str) -> float:
    """A Go ``time.ParseDuration`` string ("5s", "1m30s", "250ms") in seconds; ValueError names ``field``."""
    s = text.strip()
    pos = 0
    total = 0.0
    for match in _DURATION.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not s or pos != len(s):
        raise ValueError(f"{field}: {text!r} is not a duration (Go syntax: 5s, 250ms, 1m30s)")
    return total


def _has_parts(request: InferenceRequest) -> bool:
    """A chat message with content parts (images): upstream gives it the multimodal timeout."""
    doc = request.body.json if request.body is not None else None
    messages = doc.get("messages") if doc is not None else None
    return isinstance(messages, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) and m["content"] for m in messages
    )


class RenderTokenizer:
    """vLLM's render endpoints at one URL (a sidecar or a shared render Service), /tokenize after a 404."""

    def __init__(self, url: str, model: str, *, timeout: float = 5.0, mm_timeout: float = 30.0) -> None:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"vllm.url: {url!r} is not an http(s)://host[:port] URL")
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.mm_timeout = mm_timeout
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self._client = ScrapeClient(
            ssl_context=ssl.create_default_context() if parts.scheme == "https" else None,
            max_idle_per_host=16,  # upstream's MaxIdleConnsPerHost
            max_body_bytes=_MAX_REPLY_BYTES,
        )
        self.legacy = False  # the server has no render API: /tokenize
        self.failures = 0
        self.calls = 0

    async def close(self) -> None:
        await self._client.close()

    async def probe(self) -> str | None:
        """Render a one-word prompt: None when the server answers, else why not (for the start log)."""
        try:
            async with asyncio.timeout(self.timeout):
                ids = await self._render_prompt("warmup")
        except (OSError, TimeoutError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
        return None if ids is not None else "no token ids in the answer"

    async def token_ids(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        ids = given_ids(request)
        if ids is not None:
            return ids
        self.calls += 1
        try:
            async with asyncio.timeout(self.mm_timeout if _has_parts(request) else self.timeout):
                result = await self._render(request)
        except (OSError, TimeoutError, ValueError) as e:
            result = None
            log.debug("render_tokenize_failed", url=self.url, error=f"{type(e).__name__}: {e}")
        if result is None:
            self.failures += 1
        return result

    async def _post(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        status, reply = await self._client.post(
            self._host, self._port, self._prefix + path, orjson.dumps(body)
        )
        return status, orjson.loads(reply) if status == 200 else None

    async def _render(self, request: InferenceRequest) -> list[int] | None:
        body = request.body
        if body is None:
            return None
        messages = chat_messages(request)
        if messages is not None:
            doc: dict[str, Any] = (
                dict(body.json) if body.json is not None and body.api is ApiKind.CHAT_COMPLETIONS else {}
            )
            doc["messages"] = messages
            doc["model"] = self.model  # `vllm launch render` serves the base model's name only
            if not self.legacy:
                status, reply = await self._post(CHAT_RENDER, doc)
                if status != 404:
                    return _ids(reply.get("token_ids") if isinstance(reply, dict) else None)
                self._go_legacy(status)
            tokenize: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "add_generation_prompt": True,
            }
            tokenize.update({k: doc[k] for k in TEMPLATE_FIELDS if k in doc})
            return await self._tokenize(tokenize)
        text = prompt_text(request)
        return None if text is None else await self._render_prompt(text)

    async def _render_prompt(self, text: str) -> list[int] | None:
        if not self.legacy:
            status, reply = await self._post(COMPLETIONS_RENDER, {"model": self.model, "prompt": text})
            if status != 404:
                first = reply[0] if isinstance(reply, list) and reply else None
                return _ids(first.get("token_ids") if isinstance(first, dict) else None)
            self._go_legacy(status)
        return await self._tokenize({"model": self.model, "prompt": text})

    async def _tokenize(self, body: Mapping[str, Any]) -> list[int] | None:
        _, reply = await self._post("/tokenize", body)
        return _ids(reply.get("tokens") if isinstance(reply, dict) else None)

    def _go_legacy(self, status: int) -> None:
        self.legacy = True
        log.warning("render_api_missing", url=self.url, status=status, fallback="/tokenize")

    def debug_state(self) -> dict[str, Any]:
        return {
            "backend": "vllm",
            "url": self.url,
            "api": "/tokenize" if self.legacy else "render",
            "calls": self.calls,
            "failures": self.failures,
        }


def _ids(value: Any) -> list[int] | None:
    return value if isinstance(value, list) and all(type(t) is int for t in value) else None


_INIT_ATTEMPTS: Final = 5  # upstream initializeTokenizerForModel: 5 tries, i seconds apart


class UdsTokenizer:
    """llm-d-kv-cache's UDS tokenizer service over gRPC (``socketFile``, or host:port with ``useTCP``)."""

    def __init__(
        self,
        socket_file: str,
        model: str,
        *,
        use_tcp: bool = False,
        model_tokenizer_map: Mapping[str, str] | None = None,
        timeout: float = 5.0,
        retry_delay: float = 1.0,
    ) -> None:
        resolved = model
        if model_tokenizer_map:
            path = model_tokenizer_map.get(model)
            if path is None:
                raise ValueError(f"udsTokenizerConfig.modelTokenizerMap has no tokenizer for model {model!r}")
            # an explicit tokenizer.json names its directory, as upstream resolves it
            resolved = str(Path(path).parent) if Path(path).name == "tokenizer.json" else path
        self.model = resolved
        self.target = socket_file if use_tcp else f"unix://{socket_file}"
        self.timeout = timeout
        self.retry_delay = retry_delay
        self._channel: grpc.aio.Channel | None = None
        self.calls = 0
        self.failures = 0

    def _call(self, method: str) -> Any:
        assert self._channel is not None
        return self._channel.unary_unary(
            pb.SERVICE + method, request_serializer=None, response_deserializer=None
        )

    async def start(self) -> None:
        """Connect and initialise the model's tokenizer; raises RuntimeError after upstream's attempts."""
        options = [
            ("grpc.max_send_message_length", 100 << 20),
            ("grpc.max_receive_message_length", 100 << 20),
        ]
        self._channel = grpc.aio.insecure_channel(self.target, options=options)
        request = pb.encode(
            pb.INITIALIZE_REQUEST,
            {"model_name": self.model, "enable_thinking": False, "add_generation_prompt": True},
        )
        last = ""
        for attempt in range(_INIT_ATTEMPTS):
            if attempt:
                await asyncio.sleep(attempt * self.retry_delay)  # upstream's linear backoff
            try:
                reply = pb.decode(
                    pb.INITIALIZE_RESPONSE,
                    await self._call("InitializeTokenizer")(request, timeout=self.timeout),
                )
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
                continue
            if reply["success"]:
                return
            last = f"tokenizer initialization failed: {reply['error_message']}"
        await self.close()
        raise RuntimeError(
            f"udsTokenizerConfig: the tokenizer service at {self.target} did not initialise model "
            f"{self.model!r} after {_INIT_ATTEMPTS} attempts: {last}"
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def token_ids(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        ids = given_ids(request)
        if ids is not None:
            return ids
        if self._channel is None:
            return None
        self.calls += 1
        messages = chat_messages(request)
        try:
            if messages is not None:
                reply = await self._render_chat(request, messages)
            else:
                text = prompt_text(request)
                if text is None:
                    return None
                raw = await self._call("RenderCompletion")(
                    pb.encode(pb.RENDER_COMPLETION_REQUEST, {"model_name": self.model, "prompt": text}),
                    timeout=self.timeout,
                )
                reply = pb.decode(pb.RENDER_COMPLETION_RESPONSE, raw)
        except (grpc.aio.AioRpcError, pb.ProtoError) as e:
            self.failures += 1
            log.debug("uds_tokenize_failed", target=self.target, error=str(e))
            return None
        if not reply["success"]:
            self.failures += 1
            return None
        return list(reply["token_ids"])

    async def _render_chat(self, request: InferenceRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
        doc = request.body.json if request.body is not None and request.body.json is not None else {}
        wire: list[dict[str, Any]] = []
        for m in messages:
            content = m.get("content")
            msg: dict[str, Any] = {"role": m.get("role", "user")}
            if isinstance(content, list):
                msg["content_parts"] = [
                    {"type": p.get("type", "text"), "text": p.get("text")}
                    if p.get("type", "text") == "text"
                    else {
                        "type": p.get("type"),
                        "image_url": {"url": (p.get("image_url") or {}).get("url", "")},
                    }
                    for p in content
                    if isinstance(p, dict)
                ]
            elif content is not None:
                msg["content"] = str(content)
            if m.get("tool_calls"):
                msg["tool_calls_json"] = orjson.dumps(m["tool_calls"]).decode()
            wire.append(msg)
        body: dict[str, Any] = {
            "model_name": self.model,
            "messages": wire,
            "chat_template": doc.get("chat_template"),
            "add_generation_prompt": doc.get("add_generation_prompt", True),
            "continue_final_message": doc.get("continue_final_message"),
        }
        if doc.get("tools"):
            body["tools_json"] = orjson.dumps(doc["tools"]).decode()
        if doc.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = orjson.dumps(doc["chat_template_kwargs"]).decode()
        timeout = 30.0 if _has_parts(request) else self.timeout  # upstream's mmTimeout
        raw = await self._call("RenderChatCompletion")(
            pb.encode(pb.RENDER_CHAT_REQUEST, body), timeout=timeout
        )
        return pb.decode(pb.RENDER_CHAT_RESPONSE, raw)

    def debug_state(self) -> dict[str, Any]:
        return {
            "backend": "uds",
            "target": self.target,
            "model": self.model,
            "calls": self.calls,
            "failures": self.failures,
        }


# local / hf -----------------------------------------------------------------------------------
DEFAULT_DISCOVERY_DIR: Final = "/mnt/models"
DEFAULT_TOKENIZER_FILE: Final = "tokenizer.json"


def discover(directory: str, filename: str = DEFAULT_TOKENIZER_FILE) -> dict[str, str]:
    """Model name → tokenizer file under ``directory``, by llm-d-kv-cache's auto-discovery rules:
    ``models--org--name/snapshots/<rev>/<file>`` is ``org/name`` (the HuggingFace cache), any
    other ``a/b/<file>`` is ``a/b``.  The first found (sorted paths) wins for a name."""
    root = Path(directory)
    found: dict[str, str] = {}
    if not root.is_dir():
        return found
    for path in sorted(root.rglob(filename)):
        rel = path.parent.relative_to(root).parts
        name = ""
        for i, part in enumerate(rel):
            if part.startswith("models--") and i + 1 < len(rel) and rel[i + 1] == "snapshots":
                name = part[len("models--") :].replace("--", "/")
                break
        if not name and rel:
            name = "/".join(rel)
        if name:
            found.setdefault(name, str(path))
    return found


def find_local(
    model: str,
    *,
    directory: str = "",
    filename: str = "",
    model_tokenizer_map: Mapping[str, str] | None = None,
) -> tuple[str | None, list[str]]:
    """(the tokenizer file for ``model`` or None, what was searched).  ``modelTokenizerMap`` first,
    then discovery under ``directory`` (default ``$LOCAL_TOKENIZER_DIR`` or /mnt/models) for
    ``filename`` (default ``$LOCAL_TOKENIZER_FILENAME`` or tokenizer.json)."""
    searched: list[str] = []
    mapped = (model_tokenizer_map or {}).get(model)
    if mapped:
        searched.append(f"modelTokenizerMap[{model!r}] = {mapped}")
        return (mapped if Path(mapped).is_file() else None), searched
    directory = directory or os.environ.get("LOCAL_TOKENIZER_DIR", DEFAULT_DISCOVERY_DIR)
    filename = filename or os.environ.get("LOCAL_TOKENIZER_FILENAME", DEFAULT_TOKENIZER_FILE)
    searched.append(f"{directory}/**/{filename}")
    return discover(directory, filename).get(model), searched


def find_hf_cached(model: str, cache_dir: str) -> tuple[str | None, list[str]]:
    """(the cached tokenizer.json of HuggingFace model ``model`` under ``cache_dir`` or None, the
    places looked at): ``<dir>/<model>/tokenizer.json`` (how llm-d's Go tokenizer caches a
    download) or the hub layout ``<dir>/models--org--name/snapshots/*/tokenizer.json``."""
    flat = Path(cache_dir) / model / DEFAULT_TOKENIZER_FILE
    hub = Path(cache_dir) / ("models--" + model.replace("/", "--")) / "snapshots"
    searched = [str(flat), f"{hub}/*/{DEFAULT_TOKENIZER_FILE}"]
    if flat.is_file():
        return str(flat), searched
    if hub.is_dir():
        for snapshot in sorted(hub.iterdir()):
            candidate = snapshot / DEFAULT_TOKENIZER_FILE
            if candidate.is_file():
                return str(candidate), searched
    return None, searched


def pool_tokenizer(owner: str, pool: Any) -> UdsTokenizer | LocalTokenizer:
    """The tokenizer llm-d-kv-cache's ``tokenizersPoolConfig`` configures (a ``TokenizersPoolConfig``):
    its UDS service when ``uds.socketFile`` is set, else ``modelName``'s tokenizer.json from
    ``local`` then ``hf`` (with neither block, the HuggingFace cache at its default directory, as
    the Go pool's composite tokenizer falls back).  ConfigError names what was searched."""
    where = f"{owner}: indexerConfig.tokenizersPoolConfig"
    log.warning("deprecated_parameter", plugin=owner, parameter="indexerConfig.tokenizersPoolConfig",
                replacement="a token-producer plugin")  # fmt: skip
    model = pool.model_name
    if not model:
        raise ConfigError(f"{where}.modelName must be set")
    if pool.uds is not None and pool.uds.socket_file:
        try:
            return UdsTokenizer(pool.uds.socket_file, model, use_tcp=pool.uds.use_tcp,
                                model_tokenizer_map=pool.uds.model_tokenizer_map)  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"{where}.uds: {e}") from e
    searched: list[str] = []
    if pool.local is not None:
        path, looked = find_local(
            model,
            directory=pool.local.auto_discovery_dir,
            filename=pool.local.auto_discovery_tokenizer_file_name,
            model_tokenizer_map=pool.local.model_tokenizer_map,
        )
        searched += looked
        if path:
            return LocalTokenizer(path)
    hf = pool.hf
    if (hf is not None and hf.enabled) or (hf is None and pool.local is None):
        path, looked = find_hf_cached(model, hf.tokenizers_cache_dir if hf is not None else "./bin")
        searched += looked
        if path:
            return LocalTokenizer(path)
    raise ConfigError(
        f"{where}: no tokenizer.json for modelName {model!r} (searched: {'; '.join(searched) or 'nothing'}); "
        "the EPP does not download tokenizers"
    )
