"""A cheap ext_proc load generator: pre-encoded HTTP/2 frames over plain sockets, no Envoy.

The scale-out benchmark drives EPP processes directly (workers, peers) and must not spend
more CPU than the EPP it measures, or on this 2-core machine the client, not the EPP, sets
the ceiling.  So every byte a request sends is encoded once, at start: one HPACK block
(never-indexed literals, so it stays valid on every stream), and per prompt variant the
gRPC messages Envoy would send in FULL_DUPLEX_STREAMED mode — request headers and the whole
body in phase one; response headers and an end-of-stream body in phase two, sent when the
EPP's first reply arrives (as Envoy does once it has a destination).  Replies are not
decoded: a stream is done when its trailers (HEADERS with END_STREAM) or a RST_STREAM arrive;
the first DATA frame's gRPC message tells routed (``request_headers`` reply, field 1) from
refused (``immediate_response``, field 7).

Only the HTTP/2 the EPP's server needs from a client is implemented: preface, SETTINGS and
its ACK, PING ACK, connection-level flow control both ways, GOAWAY (the connection stops
taking streams).  It is a benchmark tool, not a general client.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from hpack import Encoder, NeverIndexedHeaderTuple

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
BIG_WINDOW = 2**31 - 1
PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def grpc_message(msg: pb.ProcessingRequest) -> bytes:
    data = msg.SerializeToString()
    return b"\x00" + struct.pack(">I", len(data)) + data


def _headers(items: Sequence[tuple[str, str]]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items])


@dataclass(frozen=True, slots=True)
class Variant:
    """One request's two phases, as gRPC message bytes."""

    phase1: bytes
    phase2: bytes


def variants(prompts: Sequence[str], model: str, max_tokens: int = 8) -> list[Variant]:
    """Envoy's messages for each prompt (``/v1/completions``, FULL_DUPLEX_STREAMED both ways)."""
    out = []
    for prompt in prompts:
        body = (
            f'{{"model":"{model}","prompt":"{prompt}","max_tokens":{max_tokens},"stream":false}}'
        ).encode()
        req_headers = [
            (":method", "POST"),
            (":path", "/v1/completions"),
            (":authority", "bench"),
            (":scheme", "http"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        phase1 = grpc_message(
            pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=_headers(req_headers)))
        ) + grpc_message(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        resp = b'{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}'
        resp_headers = [(":status", "200"), ("content-type", "application/json")]
        phase2 = grpc_message(
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_headers(resp_headers)))
        ) + grpc_message(pb.ProcessingRequest(response_body=pb.HttpBody(body=resp, end_of_stream=True)))
        out.append(Variant(phase1, phase2))
    return out


def header_block(authority: str) -> bytes:
    """The request's HPACK block, never-indexed so it can open every stream unchanged."""
    items = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return Encoder().encode([NeverIndexedHeaderTuple(k, v) for k, v in items])


@dataclass(slots=True)
class Stats:
    latencies: list[float] = field(default_factory=list)
    routed: int = 0
    refused: int = 0
    failed: int = 0

    def merge(self, other: Stats) -> None:
        self.latencies.extend(other.latencies)
        self.routed += other.routed
        self.refused += other.refused
        self.failed += other.failed


class _Stream:
    __slots__ = ("done", "phase2", "replied", "started", "status")

    def __init__(self, phase2: bytes, done: asyncio.Future[str]) -> None:
        self.phase2 = phase2
        self.done = done
        self.started = time.perf_counter()
        self.replied = False
        self.status = "failed"


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to the EPP's ext_proc port, many concurrent streams."""

    def __init__(self, block: bytes) -> None:
        self._block = block
        self._transport: asyncio.WriteTransport | None = None
        self._buf = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._recv_unacked = 0
        self.send_window = 65535
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.WriteTransport, transport)  # uvloop's is no asyncio subclass
        settings = struct.pack(">HI", 4, BIG_WINDOW) + struct.pack(">HI", 2, 0)  # window; no push
        self._transport.write(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", BIG_WINDOW - 65535))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        for s in self._streams.values():
            if not s.done.done():
                s.done.set_result("failed")
        self._streams.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if n - pos < 9 + length:
                break
            kind, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload_at = pos + 9
            pos = payload_at + length
            if kind == DATA:
                self._on_data(sid, flags, buf, payload_at, length)
            elif kind == HEADERS:
                if flags & END_STREAM:
                    self._finish(sid)
            elif kind == RST_STREAM:
                self._finish(sid, failed=True)
            elif kind == SETTINGS:
                if not flags & ACK:
                    self._write(frame(SETTINGS, ACK, 0))
            elif kind == PING:
                if not flags & ACK:
                    self._write(frame(PING, ACK, 0, bytes(buf[payload_at:pos])))
            elif kind == WINDOW_UPDATE and sid == 0:
                self.send_window += int.from_bytes(buf[payload_at : payload_at + 4], "big") & 0x7FFFFFFF
            elif kind == GOAWAY and self._transport is not None:
                self._transport.close()
        del buf[:pos]

    # streams
    def start(self, variant: Variant, done: asyncio.Future[str]) -> None:
        sid = self._next_id
        self._next_id += 2
        self._streams[sid] = _Stream(variant.phase2, done)
        self.send_window -= len(variant.phase1)
        self._write(frame(HEADERS, END_HEADERS, sid, self._block) + frame(DATA, 0, sid, variant.phase1))

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _on_data(self, sid: int, flags: int, buf: bytearray, at: int, length: int) -> None:
        self._recv_unacked += length
        if self._recv_unacked > 1 << 30:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._recv_unacked)))
            self._recv_unacked = 0
        s = self._streams.get(sid)
        if s is None:
            return
        if not s.replied and length > 5:
            s.replied = True
            # ProcessingResponse's first field tag: 0x0a request_headers, 0x1a request_body
            # (both: routed); 0x3a immediate_response (refused by the EPP).
            tag = buf[at + 5]
            if tag == 0x3A:
                s.status = "refused"
                return
            s.status = "routed"
            self.send_window -= len(s.phase2)
            self._write(frame(DATA, END_STREAM, sid, s.phase2))
        if flags & END_STREAM:
            self._finish(sid)

    def _finish(self, sid: int, *, failed: bool = False) -> None:
        s = self._streams.pop(sid, None)
        if s is None or s.done.done():
            return
        s.done.set_result("failed" if failed else s.status)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)


async def connect(host: str, port: int) -> Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: Connection(header_block(f"{host}:{port}")), host, port)
    return conn


async def _one(conn: Connection, variant: Variant, stats: Stats) -> None:
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    conn.start(variant, done)
    status = await done
    if status == "routed":
        stats.routed += 1
        stats.latencies.append(time.perf_counter() - t0)
    elif status == "refused":
        stats.refused += 1
    else:
        stats.failed += 1


async def closed_loop(
    host: str, port: int, vs: Sequence[Variant], *, connections: int, concurrency: int, seconds: float
) -> Stats:
    """``concurrency`` streams always open, spread over ``connections`` connections (each a new
    TCP 4-tuple, so SO_REUSEPORT spreads them over the workers)."""
    conns = [await connect(host, port) for _ in range(connections)]
    stats = Stats()
    deadline = time.perf_counter() + seconds
    rng = random.Random(1)

    async def slot(i: int) -> None:
        conn = conns[i % len(conns)]
        while time.perf_counter() < deadline and not conn.closed.done():
            await _one(conn, vs[rng.randrange(len(vs))], stats)

    try:
        await asyncio.gather(*(slot(i) for i in range(concurrency)))
    finally:
        for c in conns:
            c.close()
    return stats


async def open_loop(
    host: str, port: int, vs: Sequence[Variant], *, rate: float, seconds: float, connections: int = 2
) -> Stats:
    """Requests at a steady ``rate`` (evenly spaced), latency from the scheduled send time."""
    conns = [await connect(host, port) for _ in range(connections)]
    stats = Stats()
    rng = random.Random(2)
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    total = int(rate * seconds)
    try:
        for i in range(total):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.create_task(_one(conns[i % len(conns)], vs[rng.randrange(len(vs))], stats))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.gather(*tasks)
    finally:
        for c in conns:
            c.close()
    return stats


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
