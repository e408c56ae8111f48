"""The decode-side P/D proxy, llm-d's routing sidecar protocol (nixlv2 connector) over aiohttp.

It listens on the pool port in front of one decode engine. A request carrying the EPP's
``x-prefiller-host-port`` header is served in two legs: the prefill leg goes to the prefiller
(``stream=false``, ``stream_options`` removed, every token limit 1, ``kv_transfer_params`` asking for a
remote decode, a fresh request id), retried only on 502/503/504; its error is the client's answer.
The decode leg goes to the local engine with the original body plus the prefiller's
``kv_transfer_params`` and is streamed back, ``usage...cached_tokens`` taken from the prefiller.
Without the header, or on any other path, the proxy is a plain reverse proxy to the local engine.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

PREFILLER_HEADER: Final = "x-prefiller-host-port"
PD_PATHS: Final = ("/v1/chat/completions", "/v1/completions")
RETRYABLE: Final = frozenset({502, 503, 504})
TOKEN_LIMITS: Final = ("max_tokens", "max_completion_tokens")
_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)
_NO_REMOTE: Final = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    port: int = 8000
    host: str = "127.0.0.1"
    vllm_host: str = "127.0.0.1"
    vllm_port: int = 8200
    prefill_max_retries: int = 0
    prefill_retry_backoff_s: float = 0.2
    prefill_timeout_s: float = 300.0
    enable_prefiller_sampling: bool = False


@dataclass(slots=True)
class ProxyStats:
    """What the proxy did, served at GET /pdproxy/state (tests and the benchmark read it)."""

    prefill_legs: int = 0  # prefill legs that succeeded
    prefill_failures: int = 0  # requests answered with the prefiller's error (after retries)
    prefill_retries: int = 0
    decode_legs: int = 0
    plain: int = 0  # inference requests (P/D paths) proxied without the header
    passthrough: int = 0  # everything else: /metrics, /health, /v1/models, ...
    prefillers: Counter[str] = field(default_factory=Counter)


class _PrefillFailed(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg: the same request, non-streamed, one token, asking for a remote decode."""
    leg = dict(body)
    leg["stream"] = False
    leg.pop("stream_options", None)
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    leg["kv_transfer_params"] = dict(_NO_REMOTE)
    return leg


def _forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in headers.items()
        if k.lower() not in _HOP and k.lower() not in (PREFILLER_HEADER, "content-length")
    }


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "PrefillError", "param": None, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class PdProxy:
    """One proxy in front of one decode engine; ``app()`` is its aiohttp application."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.stats = ProxyStats()
        self._session: aiohttp.ClientSession | None = None
        self._rng = random.Random()
        self.local = f"http://{config.vllm_host}:{config.vllm_port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        app.router.add_get("/pdproxy/state", self._state)
        for path in PD_PATHS:
            app.router.add_post(path, self._pd)
        app.router.add_route("*", "/{tail:.*}", self._plain)
        return app

    async def _open(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    async def _state(self, _: web.Request) -> web.Response:
        s = self.stats
        state = {
            "prefill_legs": s.prefill_legs,
            "prefill_failures": s.prefill_failures,
            "prefill_retries": s.prefill_retries,
            "decode_legs": s.decode_legs,
            "plain": s.plain,
            "passthrough": s.passthrough,
            "prefillers": dict(s.prefillers),
        }
        return web.Response(body=orjson.dumps(state), content_type="application/json")

    # ---- the two legs -------------------------------------------------------------------------

    async def _pd(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get(PREFILLER_HEADER, "").strip()
        if not header:
            self.stats.plain += 1
            return await self._forward(request)
        choices = [h.strip() for h in header.split(",") if h.strip()]
        prefiller = self._rng.choice(choices) if self.config.enable_prefiller_sampling else choices[0]
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.")
        headers = _forward_headers(request.headers)
        try:
            prefilled = await self._prefill(prefiller, request.path, body, headers)
        except _PrefillFailed as exc:
            self.stats.prefill_failures += 1
            return exc.response
        self.stats.prefill_legs += 1
        self.stats.prefillers[prefiller] += 1
        decode = dict(body)
        decode["kv_transfer_params"] = prefilled.get("kv_transfer_params")
        cached = _cached_tokens(prefilled)
        self.stats.decode_legs += 1
        return await self._relay(
            request, "POST", request.path_qs, orjson.dumps(decode), headers, cached, prefiller
        )

    async def _prefill(
        self, prefiller: str, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        """POST the prefill leg, retrying 502/503/504 (and unreachable prefillers, as a 502)."""
        data = orjson.dumps(prefill_body(body))
        config = self.config
        attempt = 0
        while True:
            leg_headers = {**headers, "X-Request-Id": uuid.uuid4().hex, "Content-Type": "application/json"}
            try:
                async with asyncio.timeout(config.prefill_timeout_s):
                    async with self.session.post(
                        f"http://{prefiller}{path}", data=data, headers=leg_headers
                    ) as r:
                        payload = await r.read()
                        status = r.status
                        content_type = r.headers.get("Content-Type", "application/json")
            except TimeoutError:
                raise _PrefillFailed(
                    _error(504, f"prefill leg to {prefiller} timed out after {config.prefill_timeout_s:g} s")
                ) from None
            except aiohttp.ClientError as exc:
                status, payload = 502, b""
                failure = _error(502, f"prefiller {prefiller} unreachable: {type(exc).__name__}: {exc}")
            else:
                failure = web.Response(status=status, body=payload, headers={"Content-Type": content_type})
            if status == 200:
                try:
                    answer = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise _PrefillFailed(_error(502, f"prefiller {prefiller} sent invalid JSON")) from None
                if not isinstance(answer, dict) or not isinstance(answer.get("kv_transfer_params"), dict):
                    raise _PrefillFailed(_error(502, f"prefiller {prefiller} returned no kv_transfer_params"))
                return answer
            if status not in RETRYABLE or attempt >= config.prefill_max_retries:
                raise _PrefillFailed(failure)
            attempt += 1
            self.stats.prefill_retries += 1
            await asyncio.sleep(config.prefill_retry_backoff_s)  # the configured retry backoff

    async def _plain(self, request: web.Request) -> web.StreamResponse:
        self.stats.passthrough += 1
        return await self._forward(request)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        return await self._relay(
            request, request.method, request.path_qs, body, _forward_headers(request.headers), None, None
        )

    async def _relay(
        self,
        request: web.Request,
        method: str,
        path_qs: str,
        body: bytes,
        headers: dict[str, str],
        cached: int | None,
        prefiller: str | None,
    ) -> web.StreamResponse:
        """Send to the local engine and stream its answer back, rewriting cached_tokens if given."""
        try:
            upstream = await self.session.request(method, self.local + path_qs, data=body, headers=headers)
        except aiohttp.ClientError as exc:
            return _error(502, f"decode engine {self.local} unreachable: {type(exc).__name__}")
        async with upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if prefiller is not None:
                out_headers["x-pd-prefiller"] = prefiller
            if cached is None or "text/event-stream" not in upstream.headers.get("Content-Type", ""):
                if cached is not None:
                    payload = _rewrite_cached(await upstream.read(), cached)
                    out_headers.pop("Content-Length", None)
                    return web.Response(status=upstream.status, body=payload, headers=out_headers)
                out_headers.pop("Content-Length", None)
                response = web.StreamResponse(status=upstream.status, headers=out_headers)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            out_headers.pop("Content-Length", None)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            async for line in upstream.content:
                if line.startswith(b"data: {") and b'"cached_tokens"' in line:
                    line = b"data: " + _rewrite_cached(line[6:].rstrip(b"\n"), cached) + b"\n"
                await response.write(line)
            await response.write_eof()
            return response


def _cached_tokens(answer: dict[str, Any]) -> int | None:
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def _rewrite_cached(payload: bytes, cached: int) -> bytes:
    """Set usage.prompt_tokens_details.cached_tokens to the prefiller's (llm-d's sidecar does too)."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    usage = data.get("usage") if isinstance(data, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return payload
    details["cached_tokens"] = cached
    return orjson.dumps(data)
