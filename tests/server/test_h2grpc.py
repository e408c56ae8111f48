"""The EPP's own HTTP/2 gRPC transport, checked against independent peers.

grpc core (grpc.aio's client) is the main peer: if our framing, HPACK, flow control or
trailers were wrong, its calls would fail.  Frames grpc never sends (CONTINUATION, padding,
PING from a raw peer, a bad preface) are written by hand over a plain socket.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.extproc import SERVICE_NAME
from epp.server.h2 import H2GrpcServer, H2Limits
from epp.server.h2 import connection as h2connection
from epp.server.h2 import frames as h2
from epp.server.health import HealthServicer
from epp.server.tls import CERT_FILE, KEY_FILE, generate_self_signed
from epp.server.transport import Tls

PROCESS = f"/{SERVICE_NAME}/Process"


class EchoSession:
    """Stands in for ``session.ExtProcSession``: echoes raw messages, at once unless held (then via ``route``)."""

    def __init__(self, servicer: EchoServicer) -> None:
        self._servicer = servicer
        self.finished = False
        self.route_pending = False
        self._held: bytes = b""
        self._open = True

    def handle(self, msg: bytes) -> list[bytes]:
        self._servicer.started.set()
        if msg == b"boom":
            raise RuntimeError("boom")
        if msg == b"end":
            self.finished = True
            return [b"ending"]
        if not self._servicer.release.is_set():
            self._held, self.route_pending = msg, True
            return []
        return [msg]

    async def route(self) -> list[bytes]:
        self.route_pending = False
        await self._servicer.release.wait()
        return [self._held]

    def close(self) -> None:
        if self._open:
            self._open = False
            self._servicer.open_sessions -= 1
        self._servicer.closed.set()


class EchoServicer:
    """Stands in for ExtProcServicer; ``release`` cleared holds messages (the session awaits)."""

    decode = staticmethod(bytes)  # raw bytes in: the sessions echo them

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.open_sessions = 0

    def open(self) -> EchoSession:
        self.open_sessions += 1
        return EchoSession(self)

    async def wait_idle(self) -> None:
        while self.open_sessions:
            self.closed.clear()
            await self.closed.wait()


@pytest.fixture
async def echo() -> AsyncIterator[tuple[EchoServicer, H2GrpcServer, int]]:
    servicer = EchoServicer()
    server = H2GrpcServer(servicer, HealthServicer(lambda: True))  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, None)
    yield servicer, server, port
    await server.stop(0.0)


def raw_stream(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(PROCESS)  # no serializers: bytes both ways


async def test_messages_larger_than_every_window_flow_both_ways(echo: Any) -> None:
    _, _, port = echo
    big = [bytes([i]) * (3 * 1024 * 1024 + i) for i in range(3)]  # > 64 KB windows and 16 KB frames
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        for m in big:
            await call.write(m)
        await call.done_writing()
        got = [m async for m in call]
        assert got == big
        assert await call.code() == grpc.StatusCode.OK


async def test_many_concurrent_streams_on_one_connection(echo: Any) -> None:
    _, server, port = echo
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:

        async def one(i: int) -> list[bytes]:
            call = raw_stream(ch)()
            msgs = [f"{i}-{j}".encode() for j in range(5)]
            for m in msgs:
                await call.write(m)
            await call.done_writing()
            got = [m async for m in call]
            assert got == msgs
            return got

        results = await asyncio.gather(*(one(i) for i in range(300)))
    assert len(results) == 300
    assert len(server.connections) <= 1  # one HTTP/2 connection carried them all


async def test_handler_error_ends_the_call_with_a_status(echo: Any) -> None:
    servicer, _, port = echo
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        await call.write(b"ok")
        await call.write(b"boom")
        await call.done_writing()
        assert await call.read() == b"ok"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        assert e.value.code() == grpc.StatusCode.UNKNOWN
        assert servicer.closed.is_set()


async def test_messages_queued_behind_an_awaiting_one_keep_their_order(echo: Any) -> None:
    servicer, _, port = echo
    servicer.release.clear()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        await call.write(b"first")
        await servicer.started.wait()
        for m in (b"second", b"third", b"fourth"):
            await call.write(m)
        servicer.release.set()
        await call.done_writing()
        assert [m async for m in call] == [b"first", b"second", b"third", b"fourth"]
        assert servicer.closed.is_set()


async def test_a_finished_session_ends_the_call_while_the_client_still_sends(echo: Any) -> None:
    servicer, _, port = echo
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        await call.write(b"end")
        assert await call.read() == b"ending"
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        assert servicer.closed.is_set()


async def test_client_cancel_runs_the_servicer_cleanup(echo: Any) -> None:
    servicer, _, port = echo
    servicer.release.clear()  # hold the first message
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        await call.write(b"held")
        await servicer.started.wait()
        call.cancel()
        await asyncio.wait_for(servicer.closed.wait(), 5)


async def test_unknown_method_is_unimplemented(echo: Any) -> None:
    _, _, port = echo
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ch.unary_unary("/no.Such/Method")(b"x")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/no.Such/Method" in (e.value.details() or "")


async def test_health_check_list_and_watch(echo: Any) -> None:
    _, _, port = echo
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        listed = await stub.List(health_pb2.HealthListRequest())
        assert listed.statuses[SERVICE_NAME].status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in stub.Watch(health_pb2.HealthCheckRequest()):
                pass
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_stop_drains_in_flight_calls_and_refuses_new_ones() -> None:
    servicer = EchoServicer()
    server = H2GrpcServer(servicer)  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, None)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        servicer.release.clear()
        call = raw_stream(ch)()
        await call.write(b"in flight")
        await servicer.started.wait()
        stopping = asyncio.create_task(server.stop(10.0))
        await asyncio.sleep(0)  # one loop turn: stop() has sent GOAWAY and closed the listener
        assert server.stopping
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # a new call needs a new connection
            await ch.unary_unary(PROCESS)(b"new", timeout=2)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        servicer.release.set()  # the in-flight call finishes during the grace period
        await call.done_writing()
        assert [m async for m in call] == [b"in flight"]
        assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(stopping, 5)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)  # the listener is gone


async def test_stop_cancels_what_outlives_the_grace_period() -> None:
    servicer = EchoServicer()
    servicer.release.clear()
    server = H2GrpcServer(servicer)  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, None)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = raw_stream(ch)()
        await call.write(b"stuck")
        await servicer.started.wait()
        await server.stop(0.05)
        await asyncio.wait_for(servicer.closed.wait(), 5)
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()


async def test_tls_with_reload(tmp_path: Path) -> None:
    first = generate_self_signed(key_bits=2048, hosts=("127.0.0.1",))
    second = generate_self_signed(key_bits=2048, hosts=("127.0.0.1",))
    (tmp_path / CERT_FILE).write_bytes(first[0])
    (tmp_path / KEY_FILE).write_bytes(first[1])
    server = H2GrpcServer(EchoServicer(), HealthServicer(lambda: True))  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, Tls(str(tmp_path), reload=True))

    async def check(trusted: bytes) -> Any:
        creds = grpc.ssl_channel_credentials(root_certificates=trusted)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as ch:
            return await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)

    try:
        assert (await check(first[0])).status == health_pb2.HealthCheckResponse.SERVING
        for name, data in ((CERT_FILE, second[0]), (KEY_FILE, second[1])):
            tmp = tmp_path / f".{name}"
            tmp.write_bytes(data)
            tmp.replace(tmp_path / name)
        for _ in range(100):  # the reloader polls once a second, after a 0.25 s debounce
            try:
                await check(second[0])
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)  # poll interval: retry until the reloaded certificate serves
        assert (await check(second[0])).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0.0)


# -- a raw HTTP/2 peer for the frames grpc core never sends ----------------------------------------


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return h2.frame(kind, flags, sid, payload)


async def read_frames(
    reader: asyncio.StreamReader, until_stream_end: int
) -> list[tuple[int, int, int, bytes]]:
    out = []
    while True:
        head = await asyncio.wait_for(reader.readexactly(9), 5)
        n = int.from_bytes(head[:3], "big")
        kind, flags, sid = head[3], head[4], int.from_bytes(head[5:], "big") & 0x7FFFFFFF
        payload = await reader.readexactly(n)
        out.append((kind, flags, sid, payload))
        if sid == until_stream_end and flags & h2.END_STREAM and kind in (h2.HEADERS, h2.DATA):
            return out
        if kind == h2.GOAWAY:
            return out


def request_block(encoder: hpack.Encoder, path: str) -> bytes:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "epp"),
               ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    return encoder.encode(headers)


async def test_continuation_padding_and_ping_from_a_raw_peer(echo: Any) -> None:
    _, _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    enc, dec = hpack.Encoder(), hpack.Decoder()
    block = request_block(enc, PROCESS)
    msg = b"hello raw peer"
    grpc_msg = b"\x00" + struct.pack(">I", len(msg)) + msg
    padded = bytes([4]) + grpc_msg + b"\x00" * 4
    writer.write(
        h2.PREFACE
        + frame(h2.SETTINGS, 0, 0)
        + frame(h2.PING, 0, 0, b"12345678")
        + frame(h2.HEADERS, 0, 1, block[:3])  # no END_HEADERS: the rest follows
        + frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[3:])
        + frame(h2.DATA, h2.PADDED | h2.END_STREAM, 1, padded)
    )
    frames = await read_frames(reader, 1)
    writer.close()
    kinds = [(k, f & h2.ACK if k in (h2.PING, h2.SETTINGS) else None) for k, f, _, _ in frames]
    assert (h2.PING, h2.ACK) in kinds
    assert any(k == h2.PING and p == b"12345678" for k, _, _, p in frames)
    data = b"".join(p for k, _, sid, p in frames if k == h2.DATA and sid == 1)
    assert data == grpc_msg
    header_blocks = [p for k, _, sid, p in frames if k == h2.HEADERS and sid == 1]
    decoded = [cast("dict[str, str]", dict(dec.decode(b))) for b in header_blocks]
    assert decoded[0][":status"] == "200" and decoded[0]["content-type"] == "application/grpc"
    assert decoded[-1]["grpc-status"] == "0"


async def test_a_bad_preface_closes_the_connection(echo: Any) -> None:
    _, _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    frames = await read_frames(reader, 0)
    assert frames[-1][0] == h2.GOAWAY
    assert int.from_bytes(frames[-1][3][4:8], "big") == h2.PROTOCOL_ERROR
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
    writer.close()


async def test_a_broken_header_block_is_a_connection_error_and_others_keep_serving(echo: Any) -> None:
    _, _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        h2.PREFACE + frame(h2.SETTINGS, 0, 0) + frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff")
    )
    frames = await read_frames(reader, 0)
    assert frames[-1][0] == h2.GOAWAY
    writer.close()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:  # the server itself is fine
        call = raw_stream(ch)()
        await call.write(b"still here")
        await call.done_writing()
        assert [m async for m in call] == [b"still here"]


async def test_a_frame_larger_than_advertised_is_refused(echo: Any) -> None:
    _, _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(h2.PREFACE + frame(h2.SETTINGS, 0, 0) + frame(h2.PING, 0, 0, b"x" * (h2.MAX_FRAME + 1)))
    frames = await read_frames(reader, 0)
    assert frames[-1][0] == h2.GOAWAY
    assert int.from_bytes(frames[-1][3][4:8], "big") == h2.FRAME_SIZE_ERROR
    writer.close()


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0  # everything written is recorded at once


@pytest.mark.parametrize("step", [1, 5, 9, 17, 4096])
async def test_any_read_boundaries_give_the_same_messages(step: int) -> None:
    """Frames and messages cut at every kind of read boundary: a message spans three DATA frames."""
    servicer = EchoServicer()
    server = H2GrpcServer(servicer)  # type: ignore[arg-type]
    conn = h2connection.Connection(server)
    transport = RecordingTransport()
    conn.connection_made(transport)
    enc = hpack.Encoder()
    big, small = b"B" * 40_000, b"small"
    wire = b"".join(b"\x00" + struct.pack(">I", len(m)) + m for m in (big, small))
    parts = [wire[i : i + h2.MAX_FRAME] for i in range(0, len(wire), h2.MAX_FRAME)]
    data = h2.PREFACE + frame(h2.SETTINGS, 0, 0)
    data += frame(h2.HEADERS, h2.END_HEADERS, 1, request_block(enc, PROCESS))
    for i, part in enumerate(parts):
        data += frame(h2.DATA, h2.END_STREAM if i == len(parts) - 1 else 0, 1, part)
    for i in range(0, len(data), step):
        conn.data_received(data[i : i + step])
    await asyncio.wait_for(servicer.closed.wait(), 5)  # the call ended: every reply was written
    await asyncio.sleep(0)  # one loop turn: the coalesced write goes out
    out = bytes(transport.out)
    frames, pos = [], 0
    while pos < len(out):
        n = int.from_bytes(out[pos : pos + 3], "big")
        sid = int.from_bytes(out[pos + 5 : pos + 9], "big")
        frames.append((out[pos + 3], out[pos + 4], sid, out[pos + 9 : pos + 9 + n]))
        pos += 9 + n
    body = b"".join(p for k, _, sid, p in frames if k == h2.DATA and sid == 1)
    assert body == wire  # both echoes, in order; the 40 KB one split into frames the peer accepts
    assert all(len(p) <= h2.MAX_FRAME for _, _, _, p in frames)
    last = frames[-1]
    assert last[0] == h2.HEADERS and last[1] & h2.END_STREAM
    assert cast("dict[str, str]", dict(hpack.Decoder().decode(last[3])))["grpc-status"] == "0"
    conn.connection_lost(None)


async def test_the_reset_over_the_flood_limit_still_closes_its_session() -> None:
    """The RST_STREAM that breaks the rapid-reset limit ends the connection; the stream it reset is
    dropped like the others (its session closed), so no session outlives its connection."""
    servicer = EchoServicer()
    server = H2GrpcServer(servicer, limits=H2Limits(reset_burst=2, reset_rate=0.0))  # type: ignore[arg-type]
    conn = h2connection.Connection(server)
    transport = RecordingTransport()
    conn.connection_made(transport)
    enc = hpack.Encoder()
    data = h2.PREFACE + frame(h2.SETTINGS, 0, 0)
    for sid in (1, 3, 5):  # each reset before any answer: the third is one too many
        data += frame(h2.HEADERS, h2.END_HEADERS, sid, request_block(enc, PROCESS))
        data += frame(h2.RST_STREAM, 0, sid, struct.pack(">I", h2.CANCEL))
    conn.data_received(data)
    goaway = bytes(transport.out).rfind(bytes((h2.GOAWAY, 0, 0, 0, 0, 0)))
    assert transport.closed and goaway > 0
    assert struct.unpack_from(">I", transport.out, goaway + 10)[0] == h2.ENHANCE_YOUR_CALM
    assert servicer.open_sessions == 0
    conn.connection_lost(None)


async def test_cached_header_blocks_follow_the_dynamic_table() -> None:
    """The same indexed-only bytes mean another header once the table changed: no stale cache hit."""
    conn = h2connection.Connection(H2GrpcServer(EchoServicer()))  # type: ignore[arg-type]
    enc = hpack.Encoder()
    first = enc.encode([(":path", "/a")])  # literal, inserted at dynamic index 62
    again = enc.encode([(":path", "/a")])
    assert again == b"\xbe"  # now just "index 62"
    assert conn._decode_headers(first)[0] == [(b":path", b"/a")]
    assert conn._decode_headers(again)[0] == [(b":path", b"/a")]
    assert conn._decode_headers(again)[0] == [(b":path", b"/a")]  # served from the cache
    conn._decode_headers(enc.encode([(":path", "/b")]))  # inserted: index 62 is /b now
    assert conn._decode_headers(b"\xbe")[0] == [(b":path", b"/b")]


async def test_an_endless_continuation_chain_is_cut_off(echo: Any) -> None:
    _, _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(h2.PREFACE + frame(h2.SETTINGS, 0, 0) + frame(h2.HEADERS, 0, 1, b"\x82"))
    for _ in range(6):  # 6 x 16 KB > 64 KB of header block, never END_HEADERS
        writer.write(frame(h2.CONTINUATION, 0, 1, b"\x82" * h2.MAX_FRAME))
    frames = await read_frames(reader, 0)
    assert frames[-1][0] == h2.GOAWAY
    assert int.from_bytes(frames[-1][3][4:8], "big") == h2.ENHANCE_YOUR_CALM
    writer.close()
