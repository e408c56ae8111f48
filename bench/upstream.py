"""Near-instant OpenAI-shaped model servers for the overhead benchmarks (run as a subprocess).

    python -m bench.upstream --ports 4 [--chunk-gap-us 0]

Listens on N ephemeral ports of 127.0.0.1 (one process, uvloop) and prints one JSON line
``{"ports": [...]}`` once they listen.  Raw asyncio protocol, not aiohttp: the upstream must cost
far less than what is measured through it.  Routes:

* ``POST /v1/chat/completions`` and ``/v1/completions``: with ``"stream":true`` in the body, an
  SSE stream of ``max_tokens`` token events (vLLM's chunk shape, one HTTP chunk each, written
  one per loop turn or every ``--chunk-gap-us``), a usage event and ``[DONE]``; otherwise one
  JSON completion.  The request body is read whole and otherwise ignored.
* ``GET /metrics``: a small vLLM page (idle replica), so an EPP scraping it sees fresh metrics.
* ``GET /health``, ``GET /v1/models``; anything else is 404 (the routers' tokenizer and server
  info probes, which they survive).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import sys
from typing import Final, cast

_MAX_TOKENS: Final = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
_STREAM: Final = re.compile(rb'"stream"\s*:\s*true')

_METRICS: Final = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="mock-model"} 0.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="mock-model"} 0.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="mock-model"} 0.0\n'
    b"# TYPE vllm:cache_config_info gauge\n"
    b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="26000"} 1.0\n'
)
_MODELS: Final = b'{"object":"list","data":[{"id":"mock-model","object":"model","owned_by":"bench"}]}'
_COMPLETION: Final = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"mock-model",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":" the cat sat"},'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":256,"completion_tokens":%d,"total_tokens":%d}}'
)
_EVENT: Final = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"mock-model",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
_USAGE: Final = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"mock-model",'
    b'"choices":[],"usage":{"prompt_tokens":256,"completion_tokens":%d,"total_tokens":%d}}\n\n'
    b"data: [DONE]\n\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_EVENT_CHUNK: Final = _chunk(_EVENT)


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; requests are answered in order."""

    def __init__(self, name: bytes, chunk_gap: float) -> None:
        self._name = name
        self._gap = chunk_gap
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a streamed answer is being written; parse the next request after it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy:
            self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def _parse(self) -> None:
        while self._transport is not None and not self._busy:
            buf = self._buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            chunked = False
            for line in lines[1:]:
                k, _, v = line.partition(":")
                k = k.strip().lower()
                if k == "content-length":
                    length = int(v)
                elif k == "transfer-encoding" and "chunked" in v.lower():
                    chunked = True
            start = end + 4
            if chunked:
                body, consumed = _dechunk(buf, start)
                if body is None:
                    return
                del buf[:consumed]
            else:
                if len(buf) < start + length:
                    return
                body = bytes(buf[start : start + length])
                del buf[: start + length]
            self._answer(method, path, body)

    def _answer(self, method: str, path: str, body: bytes) -> None:
        t = self._transport
        assert t is not None
        path = path.split("?", 1)[0]
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            m = _MAX_TOKENS.search(body)
            tokens = int(m.group(1)) if m else 16
            if _STREAM.search(body):
                self._busy = True
                asyncio.get_running_loop().create_task(self._stream(tokens))
                return
            self._send(200, b"application/json", _COMPLETION % (tokens, tokens + 256))
        elif method == "GET" and path == "/metrics":
            self._send(200, b"text/plain; version=0.0.4", _METRICS)
        elif method == "GET" and path == "/health":
            self._send(200, b"text/plain", b"OK")
        elif method == "GET" and path == "/v1/models":
            self._send(200, b"application/json", _MODELS)
        else:
            self._send(404, b"application/json", b'{"error":{"message":"not found","code":404}}')

    def _send(self, status: int, ctype: bytes, payload: bytes) -> None:
        assert self._transport is not None
        reason = b"OK" if status == 200 else b"Not Found"
        self._transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nx-inference-pod: %s\r\n\r\n%s"
            % (status, reason, ctype, len(payload), self._name, payload)
        )

    async def _stream(self, tokens: int) -> None:
        t = self._transport
        try:
            if t is None:
                return
            t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                b"x-inference-pod: %s\r\n\r\n" % self._name
            )
            gap = self._gap
            for _ in range(tokens):
                if gap > 0:
                    await asyncio.sleep(gap)
                else:
                    await asyncio.sleep(0)  # one write per loop turn: separate TCP segments, as a server
                t = self._transport
                if t is None:
                    return
                t.write(_EVENT_CHUNK)
            t.write(_chunk(_USAGE % (tokens, tokens + 256)) + b"0\r\n\r\n")
        finally:
            self._busy = False
            if self._buf:
                self._parse()


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes | None, int]:
    """A complete chunked body starting at ``pos``: (body, end offset) or (None, 0) if incomplete."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None, 0
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n", pos)  # no trailers expected: the final CRLF
            if end < 0:
                return None, 0
            return bytes(out), end + 2
        if len(buf) < pos + size + 2:
            return None, 0
        out += buf[pos : pos + size]
        pos += size + 2


async def serve(ports: int, chunk_gap_us: float) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for i in range(ports):
        server = await loop.create_server(
            functools.partial(_Conn, f"up-{i}".encode(), chunk_gap_us / 1e6), "127.0.0.1", 0, backlog=4096
        )
        servers.append(server)
    bound = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps({"ports": bound}), flush=True)
    await asyncio.Event().wait()  # until SIGTERM


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=4)
    ap.add_argument("--chunk-gap-us", type=float, default=0.0, help="pause between streamed events")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.ports, args.chunk_gap_us))
    except ImportError:  # pragma: no cover - uvloop is a project dependency
        asyncio.run(serve(args.ports, args.chunk_gap_us))
    return 0


if __name__ == "__main__":
    sys.exit(main())
