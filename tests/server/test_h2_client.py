"""``StreamClient`` (epp.server.h2.client) against grpc-core, the EPP's own server and a raw one.

grpc-core is the reference: the HTTP/2 implementation every gRPC stack is checked against.  The
same messages arriving whole and in order at a ``grpc.aio`` server, split into 16 KiB DATA frames
and paced by its WINDOW_UPDATEs, show our framing and flow control agree with it; a connection
it keeps past its SETTINGS-ACK deadline shows our handshake does.  The EPP's server (the sync
port's real peer) must keep the client through its handshake and keepalive deadlines and take
the next message after ending a call.  A raw server drives what neither sends on demand: a zero
window, exact grants, GOAWAY, RST_STREAM, trailers and broken frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

import grpc
import hpack
import pytest

from epp.server.h2 import frames as h2
from epp.server.h2.client import StreamClient, UnaryClient
from epp.server.h2.connection import KEEPALIVE_PING, Connection
from epp.server.h2.limits import DEFAULT_LIMITS, H2Limits
from epp.server.peering import PUBLISH_PATH, _PublishServer
from epp.testing.waiting import until

Frame = tuple[int, int, int, bytes]  # type, flags, stream, payload
Peer = tuple[int, list[bytes]]  # a server's port, and the messages it received in order
Stack = contextlib.AsyncExitStack
ZERO_WINDOW = h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.S_INITIAL_WINDOW_SIZE, 0))
SETTINGS_TIMEOUT = 0.3  # grpc-core's SETTINGS-ACK deadline and the EPP's handshake_timeout here


class Spy(StreamClient):
    """``StreamClient`` that also records every frame it reads."""

    def __init__(self, path: bytes, authority: bytes, *, max_queued: int = 1000) -> None:
        super().__init__(path, authority, max_queued=max_queued)
        self.read: list[Frame] = []

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        self.read.append((kind, flags, sid, bytes(payload)))
        super()._on_frame(kind, flags, sid, payload)


class Raw(asyncio.Protocol):
    """A hand-written server: writes ``greeting`` at once, records the client's frames."""

    def __init__(self, greeting: bytes) -> None:
        self.greeting = greeting
        self.frames: list[Frame] = []
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._preface = False
        self._pings = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.greeting)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._preface:
            if len(self._buf) < len(h2.PREFACE):
                return
            assert self._buf.startswith(h2.PREFACE)
            self._buf, self._preface = self._buf[len(h2.PREFACE) :], True
        while len(self._buf) >= 9 and len(self._buf) >= 9 + int.from_bytes(self._buf[:3], "big"):
            n = int.from_bytes(self._buf[:3], "big")
            kind, flags, sid = struct.unpack_from(">BBI", self._buf, 3)
            self.frames.append((kind, flags, sid, self._buf[9 : 9 + n]))
            self._buf = self._buf[9 + n :]

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def settled(self) -> None:
        await until(lambda: (h2.SETTINGS, h2.ACK, 0, b"") in self.frames, 5, what="the SETTINGS ACK")

    async def barrier(self) -> None:
        """A PING, then its ACK: what the client wrote before reading the PING has arrived."""
        self._pings += 1
        token = struct.pack(">Q", self._pings)
        self.write(h2.frame(h2.PING, 0, 0, token))
        await until(lambda: (h2.PING, h2.ACK, 0, token) in self.frames, 5, what="the PING ACK")

    def body(self, sid: int) -> bytes:
        return b"".join(p for k, _, s, p in self.frames if k == h2.DATA and s == sid)

    async def wait_body(self, sid: int, n: int) -> None:
        await until(lambda: len(self.body(sid)) >= n, 5, what=f"{n} bytes of DATA on stream {sid}")

    def messages(self, sid: int) -> list[bytes]:
        """The stream's whole gRPC messages, reassembled from its DATA payloads."""
        body, out = self.body(sid), []
        while len(body) >= 5 and len(body) >= 5 + h2.U32.unpack_from(body, 1)[0]:
            n = h2.U32.unpack_from(body, 1)[0]
            assert body[0] == 0  # uncompressed
            out.append(body[5 : 5 + n])
            body = body[5 + n :]
        return out

    def headers_on(self) -> list[int]:
        return [s for k, _, s, _ in self.frames if k == h2.HEADERS]


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with contextlib.AsyncExitStack() as s:
        yield s


async def dial(stack: Stack, port: int, max_queued: int = 1000) -> Spy:
    authority = f"127.0.0.1:{port}".encode()
    _, client = await asyncio.get_running_loop().create_connection(
        lambda: Spy(PUBLISH_PATH, authority, max_queued=max_queued), "127.0.0.1", port
    )

    async def close() -> None:
        client.close()
        await asyncio.wait_for(client.closed, 5)

    stack.push_async_callback(close)
    return client


Metadata = tuple[tuple[str, str | bytes], ...]


async def serve_grpc(stack: Stack, *, bdp: bool, metadata: list[Metadata] | None = None) -> Peer:
    """grpc-core's server.  Without BDP probing its windows stay 65,535 bytes and its frames
    16 KiB; with it (its default) it announces 4 MiB of both and PINGs to measure the path.
    ``metadata``: each call's request metadata, as grpc-core decoded it, in order."""
    received: list[bytes] = []

    async def publish(requests: AsyncIterator[bytes], context: Any) -> bytes:
        if metadata is not None:
            metadata.append(tuple(context.invocation_metadata()))
        async for message in requests:
            received.append(message)
        return b""

    timeout = ("grpc.http2.settings_timeout", int(SETTINGS_TIMEOUT * 1000))
    handler = grpc.stream_unary_rpc_method_handler(publish)
    return await grpc_core(stack, handler, [timeout, ("grpc.http2.bdp_probe", int(bdp))]), received


async def grpc_core(stack: Stack, handler: Any, options: list[tuple[str, int]] | None = None) -> int:
    """grpc-core serving ``handler`` at PUBLISH_PATH on a free port, stopped with ``stack``."""
    server = grpc.aio.server(options=options)
    service, method = PUBLISH_PATH.decode().strip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, None)
    return int(port)


async def serve_epp(stack: Stack, limits: H2Limits) -> Peer:
    received: list[bytes] = []
    server = _PublishServer(limits, received.append)
    listening = await asyncio.get_running_loop().create_server(lambda: Connection(server), "127.0.0.1", 0)

    async def stop() -> None:
        for conn in list(server.connections):
            conn.abort()
        listening.close()
        await listening.wait_closed()

    stack.push_async_callback(stop)
    return int(listening.sockets[0].getsockname()[1]), received


async def serve_raw(stack: Stack, greeting: bytes = h2.frame(h2.SETTINGS, 0, 0)) -> tuple[Raw, int]:
    raw = Raw(greeting)
    listening = await asyncio.get_running_loop().create_server(lambda: raw, "127.0.0.1", 0)

    async def stop() -> None:
        if raw.transport is not None:
            raw.transport.close()
        listening.close()
        await listening.wait_closed()

    stack.push_async_callback(stop)
    return raw, int(listening.sockets[0].getsockname()[1])


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


async def closed_within(client: StreamClient, seconds: float) -> bool:
    done, _ = await asyncio.wait({client.closed}, timeout=seconds)
    return bool(done)


@pytest.mark.parametrize("peer", ["grpc-core", "grpc-core-bdp", "epp"])
async def test_messages_arrive_whole_and_in_order(stack: Stack, peer: str) -> None:
    if peer == "epp":
        limits = replace(DEFAULT_LIMITS, handshake_timeout=SETTINGS_TIMEOUT)
        port, received = await serve_epp(stack, limits)
    else:
        port, received = await serve_grpc(stack, bdp=peer == "grpc-core-bdp")
    # Control: the server closes a client that never ACKs its SETTINGS within the deadline.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    await asyncio.wait_for(reader.read(-1), 5 * SETTINGS_TIMEOUT)  # EOF: it closed the connection
    writer.close()
    await writer.wait_closed()

    client = await dial(stack, port)
    small = [b"", b"x", b"", payload(100, 1)]
    assert all(client.send(m) for m in small)
    await until(lambda: len(received) == len(small), 5, what="the small messages")
    sizes = [10_000] * 8 + [16_379, 16_380, 16_384, 16_389, 40_000, 0, 65_530, 65_535, 70_000, 3]
    sizes += [100_000, 150_000, 200_000, 250_000, 300_000, 0, 7]  # > 1 MiB: beyond the 64 KiB windows
    big = [payload(n, seed) for seed, n in enumerate(sizes)]
    assert all(client.send(m) for m in big)
    if peer == "grpc-core":  # 64 KiB windows (the others grant 4 and 16 MiB): spent, the rest waits
        assert client.sent < len(small) + len(big)
    await until(lambda: len(received) == len(small) + len(big), 10, what="every message")
    assert received == small + big
    assert (client.sent, client.refused, client.calls) == (len(small) + len(big), 0, 1)
    # Past the SETTINGS deadline the connection stands (the client ACKed) and still carries messages.
    assert not await closed_within(client, 2 * SETTINGS_TIMEOUT)
    assert client.send(b"last")
    await until(lambda: received[-1:] == [b"last"], 5, what="the last message")
    assert client.connected


async def test_epp_server_ends_a_call_and_the_next_message_opens_another(stack: Stack) -> None:
    port, received = await serve_epp(stack, replace(DEFAULT_LIMITS, max_message_bytes=1000))
    client = await dial(stack, port)
    assert all(client.send(m) for m in (b"one", b"two", payload(1000, 1)))
    await until(lambda: len(received) == 3, 5, what="three messages")
    assert client.send(payload(5000, 2))  # over max_message_bytes: the server ends the call
    await until(lambda: any(k == h2.HEADERS and f & h2.END_STREAM for k, f, _, _ in client.read), 5)
    sid, block = next((s, p) for k, f, s, p in client.read if k == h2.HEADERS and f & h2.END_STREAM)
    fields = {str(name): str(value) for name, value in hpack.Decoder().decode(block)}
    assert (sid, fields["grpc-status"]) == (1, str(h2.RESOURCE_EXHAUSTED))
    assert client.send(b"after")
    await until(lambda: len(received) == 4, 5, what="the message after the refusal")
    assert received == [b"one", b"two", payload(1000, 1), b"after"]
    assert (client.calls, client.sent, client.refused) == (2, 5, 0)
    assert client.connected


async def test_epp_server_keepalive_pings_are_answered(stack: Stack) -> None:
    port, received = await serve_epp(
        stack, replace(DEFAULT_LIMITS, keepalive_time=0.2, keepalive_timeout=0.5)
    )
    client = await dial(stack, port)
    # Idle: the server PINGs after 0.2 s of silence and aborts a client that has not answered in 0.5 s.
    assert not await closed_within(client, 1.5)
    pings = [p for k, f, _, p in client.read if k == h2.PING and not f & h2.ACK]
    assert pings.count(KEEPALIVE_PING) >= 2  # a second PING: the first was answered
    assert client.send(b"awake")
    await until(lambda: received == [b"awake"], 5, what="the message after the idle time")


async def test_queue_waits_for_the_windows_and_refuses_beyond_max_queued(stack: Stack) -> None:
    raw, port = await serve_raw(stack, ZERO_WINDOW)
    client = await dial(stack, port, max_queued=3)
    await raw.settled()
    messages = [payload(20_000, 1), payload(30_000, 2), payload(40_000, 3)]
    assert [client.send(m) for m in messages] == [True, True, True]
    assert client.send(b"fourth") is False
    assert (client.sent, client.refused) == (0, 1)
    await raw.barrier()
    assert raw.headers_on() == [1]
    assert raw.body(1) == b""  # a zero stream window: nothing may leave
    total, granted = sum(5 + len(m) for m in messages), h2.DEFAULT_WINDOW
    raw.write(h2.frame(h2.WINDOW_UPDATE, 0, 1, h2.U32.pack(1 << 20)))  # now the connection's window bounds it
    while True:
        want = min(granted, total)
        await raw.wait_body(1, want)
        await raw.barrier()
        assert len(raw.body(1)) == want  # each window used whole, never beyond
        if want == total:
            break
        raw.write(h2.frame(h2.WINDOW_UPDATE, 0, 0, h2.U32.pack(7_000)))  # grants that cut messages
        granted += 7_000
    assert raw.messages(1) == messages
    assert client.send(payload(10_000, 4))  # the queue is empty, the window too small: not written whole
    await raw.barrier()
    assert len(raw.body(1)) == granted  # what the connection's window had left, no more
    raw.write(h2.frame(h2.WINDOW_UPDATE, 0, 0, h2.U32.pack(1 << 20)))
    await raw.wait_body(1, total + 10_005)
    assert raw.messages(1) == [*messages, payload(10_000, 4)]
    assert (client.sent, client.refused, client.calls) == (4, 1, 1)


async def test_a_message_cut_by_the_end_of_its_call_is_dropped(stack: Stack) -> None:
    raw, port = await serve_raw(stack, ZERO_WINDOW)
    client = await dial(stack, port)
    await raw.settled()
    assert client.send(payload(1000, 1))
    assert client.send(b"next")
    raw.write(h2.frame(h2.WINDOW_UPDATE, 0, 1, h2.U32.pack(100)))
    await raw.wait_body(1, 100)  # the first message begun, not whole
    raw.write(h2.frame(h2.RST_STREAM, 0, 1, h2.U32.pack(h2.CANCEL)))
    await until(lambda: raw.headers_on() == [1, 3], 5, what="HEADERS on stream 3")
    raw.write(h2.frame(h2.WINDOW_UPDATE, 0, 3, h2.U32.pack(1 << 20)))
    await raw.wait_body(3, 5 + len(b"next"))
    await raw.barrier()
    assert raw.body(3) == b"\0\0\0\0\x04next"  # the rest of the cut message never follows
    assert (client.sent, client.calls) == (1, 2)


@pytest.mark.parametrize(
    "closing",
    [
        pytest.param(h2.frame(h2.GOAWAY, 0, 0, h2.U32.pack(1) + h2.U32.pack(h2.NO_ERROR)), id="goaway"),
        pytest.param(bytes((0, 0x40, 0x01, h2.DATA, 0, 0, 0, 0, 1)), id="frame-over-16KiB"),
        pytest.param(h2.frame(h2.SETTINGS, 0, 0, b"\0" * 5), id="settings-of-5-bytes"),
        pytest.param(h2.frame(h2.PING, 0, 0, b"\0" * 7), id="ping-of-7-bytes"),
        pytest.param(h2.frame(h2.WINDOW_UPDATE, 0, 0, b"\0" * 3), id="window-update-of-3-bytes"),
        pytest.param(h2.frame(h2.WINDOW_UPDATE, 0, 0, h2.U32.pack(h2.MAX_WINDOW)), id="window-over-2^31-1"),
        pytest.param(
            h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.S_INITIAL_WINDOW_SIZE, h2.MAX_WINDOW + 1)),
            id="initial-window-over-2^31-1",
        ),
    ],
)
async def test_goaway_or_a_broken_frame_closes_the_client(stack: Stack, closing: bytes) -> None:
    raw, port = await serve_raw(stack)
    client = await dial(stack, port)
    assert client.send(b"one")
    await until(lambda: raw.messages(1) == [b"one"], 5, what="the first message")
    raw.write(closing)
    await asyncio.wait_for(client.closed, 5)
    assert not client.connected
    assert client.send(b"two") is False
    assert client.refused == 1
    await until(lambda: raw.transport is None, 5, what="the raw server's side closed")


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(h2.frame(h2.RST_STREAM, 0, 1, h2.U32.pack(h2.NO_ERROR)), id="rst-stream"),
        pytest.param(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, h2.OK_TRAILERS), id="trailers"),
    ],
)
async def test_a_call_the_server_ended_is_followed_by_a_new_stream(stack: Stack, end: bytes) -> None:
    raw, port = await serve_raw(stack)
    client = await dial(stack, port)
    assert client.send(b"first")
    await until(lambda: raw.messages(1) == [b"first"], 5, what="the first message")
    raw.write(end)
    await raw.barrier()  # the client has read the end of the call
    assert client.send(b"second")
    assert client.send(b"third")
    await until(lambda: raw.messages(3) == [b"second", b"third"], 5, what="the messages on stream 3")
    assert raw.headers_on() == [1, 3]
    assert raw.messages(1) == [b"first"]
    assert (client.calls, client.sent, client.refused) == (2, 3, 0)
    assert client.connected


async def test_a_closing_client_refuses_at_once_rather_than_losing_messages(stack: Stack) -> None:
    """Between ``close`` and ``connection_lost`` (a loop iteration) a send would be thrown away:
    it is refused and counted instead, and ``connected`` already says no."""
    raw, port = await serve_raw(stack)
    client = await dial(stack, port)
    assert client.send(b"one")
    await until(lambda: raw.messages(1) == [b"one"], 5, what="the first message")
    client.close()
    assert not client.connected
    assert [client.send(b"x") for _ in range(3)] == [False, False, False]
    assert (client.sent, client.refused) == (1, 3)
    await asyncio.wait_for(client.closed, 5)


async def test_the_authorization_header_reaches_grpc_core_as_metadata(stack: Stack) -> None:
    """The never-indexed literal the client writes for ``authorization`` (the sync port's shared
    secret) is read by grpc-core, the reference decoder, as the call's metadata, on every call."""
    seen: list[Metadata] = []
    port, _ = await serve_grpc(stack, bdp=False, metadata=seen)
    token = b"Bearer s3cret-0123456789abcdef"
    _, client = await asyncio.get_running_loop().create_connection(
        lambda: StreamClient(PUBLISH_PATH, b"peer", authorization=token), "127.0.0.1", port
    )
    stack.callback(client.close)
    assert client.send(b"one")
    await until(lambda: len(seen) == 1, 5, what="the call")
    assert ("authorization", token.decode()) in seen[0]
    # the same header block opens a call after the first ends (grpc-core keeps no state of it)
    client._call_over()
    assert client.send(b"two")
    await until(lambda: len(seen) == 2, 5, what="the second call")
    assert ("authorization", token.decode()) in seen[1]


def paused(client: StreamClient) -> bool:
    """The transport told the client to stop writing (read anew each time: it changes under us)."""
    return client._paused


async def test_a_server_that_stops_reading_pauses_the_client_and_its_queue_drains_in_order(
    stack: Stack,
) -> None:
    """Windows wide open, the server stops reading: the socket's buffers fill, the transport
    pauses the client (``pause_writing``), messages then queue (at most ``max_queued``) and the
    rest are refused; once the server reads again, the queue leaves in order, nothing lost."""
    big = (1 << 31) - 1
    greeting = h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.S_INITIAL_WINDOW_SIZE, big))
    greeting += h2.frame(h2.WINDOW_UPDATE, 0, 0, h2.U32.pack(big - h2.DEFAULT_WINDOW))
    raw, port = await serve_raw(stack, greeting)
    client = await dial(stack, port, max_queued=4)
    await raw.settled()
    assert raw.transport is not None
    raw.transport.pause_reading()
    accepted: list[bytes] = []
    for i in range(2000):  # ~100 MB at most: the kernel's buffers fill long before
        message = payload(50_000, i)
        if not client.send(message):
            break
        accepted.append(message)
    assert paused(client) and client.refused == 1
    assert len(client._queue) == 4  # the queue is bounded; what is queued was accepted
    raw.transport.resume_reading()
    await until(lambda: len(raw.messages(1)) == len(accepted), 20, what="every accepted message")
    assert raw.messages(1) == accepted
    assert not paused(client) and not client._queue and client.sent == len(accepted)
    assert client.send(b"after") and client.connected


@pytest.mark.parametrize("size", [0, 1, 100_000, 3_000_000])
async def test_a_unary_response_arrives_whole_from_grpc_core(stack: Stack, size: int) -> None:
    """``UnaryClient`` against grpc-core's unary server: the response message, from empty to
    beyond every default window (each DATA frame credited as it comes), is what it sent."""
    answer = payload(size, size)

    async def snapshot(request: bytes, context: Any) -> bytes:
        return answer if request == b"ask" else b""

    handler = grpc.unary_unary_rpc_method_handler(snapshot)
    port = await grpc_core(stack, handler, [("grpc.max_send_message_length", 8 << 20)])
    _, client = await asyncio.get_running_loop().create_connection(
        lambda: UnaryClient(PUBLISH_PATH, b"peer", max_response=4 << 20), "127.0.0.1", port
    )
    stack.callback(client.close)
    assert client.send(b"ask")
    assert await asyncio.wait_for(client.response, 10) == answer


async def test_a_unary_call_refused_or_too_large_gives_none(stack: Stack) -> None:
    async def snapshot(request: bytes, context: Any) -> bytes:
        if request == b"refuse":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no secret")
        return payload(200_000, 7)

    port = await grpc_core(stack, grpc.unary_unary_rpc_method_handler(snapshot))
    loop = asyncio.get_running_loop()
    for request, limit in ((b"refuse", 1 << 20), (b"big", 100_000)):
        _, client = await loop.create_connection(
            partial(UnaryClient, PUBLISH_PATH, b"peer", max_response=limit), "127.0.0.1", port
        )
        stack.callback(client.close)
        assert client.send(request)
        assert await asyncio.wait_for(client.response, 10) is None, request
    assert await closed_within(client, 5)  # over max_response: it hung up rather than keep reading
