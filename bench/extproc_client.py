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
import itertools
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

    def record(self, status: str, latency: float) -> None:
        if status == "routed":
            self.routed += 1
            self.latencies.append(latency)
        elif status == "refused":
            self.refused += 1
        else:
            self.failed += 1


class _Stream:
    __slots__ = ("done", "phase2", "replied", "started", "status")

    def __init__(self, phase2: bytes, done: asyncio.Future[str] | None, started: float) -> None:
        self.phase2 = phase2
        self.done = done  # None: a closed loop's stream, replaced by the next one when it ends
        self.started = started
        self.replied = False
        self.status = "failed"


class ClosedLoop:
    """``slots`` streams kept open on each connection until ``deadline``: a stream that ends is
    replaced from inside the read that ended it, so the next request leaves in that read's one
    write, with no task, future or wake-up per request."""

    def __init__(self, vs: Sequence[Variant], deadline: float, seed: int = 1) -> None:
        rng = random.Random(seed)
        order = [vs[rng.randrange(len(vs))] for _ in range(4096)]
        self.variants = itertools.cycle(order)
        self.deadline = deadline
        self.stats = Stats()
        self.open = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ended(self, conn: Connection, s: _Stream, status: str) -> None:
        now = time.perf_counter()
        self.stats.record(status, now - s.started)
        if now < self.deadline and not conn.closing:
            conn.start(next(self.variants), None, now)
            return
        self.open -= 1
        if self.open == 0 and not self.finished.done():
            self.finished.set_result(None)


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to the EPP's ext_proc port, many concurrent streams.

    Per read it parses every whole frame (one ``unpack_from`` per frame header; a reply is only
    classified by its first message's tag and a stream ends on a frame with END_STREAM) and
    answers with one write: the second phases, the replacement streams of a closed loop and any
    ACKs leave together.  Windows are opened to 2^31-1 both ways at the start, so no
    WINDOW_UPDATE follows until a gigabyte has been received.
    """

    def __init__(self, block: bytes, loop: ClosedLoop | None = None) -> None:
        self._block = block
        self._loop = loop
        self._transport: asyncio.WriteTransport | None = None
        self._buf = b""
        self._out: list[bytes] = []
        self._in_read = False
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._recv_unacked = 0
        self.send_window = 65535
        self.closing = False
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
        self.closing = True
        streams, self._streams = self._streams, {}
        for s in streams.values():
            self._ended(s, "failed")
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        received = 0
        streams = self._streams
        unpack = _HEADER.unpack_from
        self._in_read = True
        while n - pos >= 9:
            hi, lo, kind, flags, sid = unpack(buf, pos)
            length = hi << 8 | lo
            end = pos + 9 + length
            if end > n:
                break
            sid &= 0x7FFFFFFF
            if kind == DATA:
                received += length
                s = streams.get(sid)
                if s is not None:
                    if not s.replied and length > 5:
                        self._first_reply(sid, s, buf[pos + 14])
                    if flags & END_STREAM:
                        self._finish(sid)
            elif kind == HEADERS:
                if flags & END_STREAM and (s := streams.pop(sid, None)) is not None:
                    self._ended(s, s.status)  # trailers: the stream is over
            else:
                self._control(kind, flags, sid, buf[pos + 9 : end])
            pos = end
        self._buf = buf[pos:] if pos < n else b""
        self._recv_unacked += received
        if self._recv_unacked > 1 << 30:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._recv_unacked)))
            self._recv_unacked = 0
        self._in_read = False
        self._flush()

    def _control(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == RST_STREAM:
            self._finish(sid, failed=True)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._out.append(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE and sid == 0:
            self.send_window += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        elif kind == GOAWAY and self._transport is not None:
            self.closing = True
            self._transport.close()

    # streams
    def start(self, variant: Variant, done: asyncio.Future[str] | None, now: float | None = None) -> None:
        """Open a stream with ``variant``'s first phase; ``done`` gets its outcome (None: the
        closed loop this connection serves is told instead)."""
        sid = self._next_id
        self._next_id += 2
        self._streams[sid] = _Stream(variant.phase2, done, time.perf_counter() if now is None else now)
        phase1 = variant.phase1
        self.send_window -= len(phase1)
        out, pack, block = self._out, _HEADER.pack, self._block
        n = len(block)
        out += (pack(n >> 8, n & 0xFF, HEADERS, END_HEADERS, sid), block)
        n = len(phase1)
        out += (pack(n >> 8, n & 0xFF, DATA, 0, sid), phase1)
        if not self._in_read:
            self._flush()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def close(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    def _first_reply(self, sid: int, s: _Stream, tag: int) -> None:
        s.replied = True
        # ProcessingResponse's first field tag: 0x0a request_headers, 0x1a request_body
        # (both: routed); 0x3a immediate_response (refused by the EPP).
        if tag == 0x3A:
            s.status = "refused"
            return
        s.status = "routed"
        n = len(s.phase2)
        self.send_window -= n
        self._out += (_HEADER.pack(n >> 8, n & 0xFF, DATA, END_STREAM, sid), s.phase2)

    def _finish(self, sid: int, *, failed: bool = False) -> None:
        s = self._streams.pop(sid, None)
        if s is not None:
            self._ended(s, "failed" if failed else s.status)

    def _ended(self, s: _Stream, status: str) -> None:
        if s.done is not None:
            if not s.done.done():
                s.done.set_result(status)
        elif self._loop is not None:
            self._loop.ended(self, s, status)

    def _flush(self) -> None:
        out = self._out
        if out:
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(b"".join(out))
            out.clear()


_HEADER = struct.Struct(">HBBBI")  # a frame header: length (16 + 8 bits), type, flags, stream id


async def connect(host: str, port: int, loop: ClosedLoop | None = None) -> Connection:
    aio = asyncio.get_running_loop()
    _, conn = await aio.create_connection(
        lambda: Connection(header_block(f"{host}:{port}"), loop), host, port
    )
    return conn


async def _one(conn: Connection, variant: Variant, stats: Stats) -> None:
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    conn.start(variant, done, t0)
    stats.record(await done, time.perf_counter() - t0)


async def closed_loop(
    host: str, port: int, vs: Sequence[Variant], *, connections: int, concurrency: int, seconds: float
) -> Stats:
    """``concurrency`` streams always open, spread over ``connections`` connections (each a new
    TCP 4-tuple, so SO_REUSEPORT spreads them over the workers).  Connections are made before
    the clock starts; the streams still open at the deadline finish and count."""
    loop = ClosedLoop(vs, deadline=float("inf"))
    conns = [await connect(host, port, loop) for _ in range(connections)]
    loop.deadline = time.perf_counter() + seconds
    try:
        for i in range(concurrency):
            loop.open += 1
            conns[i % len(conns)].start(next(loop.variants), None)
        async with asyncio.timeout(seconds + 30):
            await loop.finished
    finally:
        for c in conns:
            c.close()
    return loop.stats


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
