"""RFC 9113 conformance of the h2 transport, in process: the python-hyper ``h2`` library as an
independent well-behaved peer, and a raw peer (``h2peer``) for every frame the RFC says to refuse,
with the connection or stream error it names.  Timeouts run with short ``H2Limits``."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from grpc_health.v1 import health_pb2

from epp.server.h2 import H2GrpcServer, H2Limits
from epp.server.h2 import frames as f
from epp.server.health import HealthServicer
from tests.server.h2peer import CHECK, PROCESS, Peer, _text, frame, grpc_message, settings
from tests.server.test_h2grpc import EchoServicer

MIB = 1 << 20


async def _serve(limits: H2Limits) -> tuple[EchoServicer, H2GrpcServer, int]:
    servicer = EchoServicer()
    server = H2GrpcServer(servicer, HealthServicer(lambda: True), limits)  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0, None)
    return servicer, server, port


@pytest.fixture
async def echo() -> AsyncIterator[tuple[EchoServicer, H2GrpcServer, int]]:
    servicer, server, port = await _serve(H2Limits(max_message_bytes=1 * MIB))
    yield servicer, server, port
    await server.stop(0.0)


# -- the h2 library as a well-behaved peer -------------------------------------------------------
def h2_call(
    port: int, messages: list[bytes], *, pad: int = 0, path: str = PROCESS
) -> tuple[bytes, dict[str, str]]:
    """One gRPC call made by python-hyper's h2: the reply bytes and the trailers."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    conn.ping(b"pingpong")
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "epp"),
                            ("content-type", "application/grpc"), ("te", "trailers")])  # fmt: skip
    pending = bytearray(b"".join(grpc_message(m) for m in messages))
    data, acked = bytearray(), False
    trailers: dict[str, str] = {}
    done = False

    def handle(chunk: bytes) -> bool:
        nonlocal trailers, acked
        ended = False
        for ev in conn.receive_data(chunk):
            if isinstance(ev, h2.events.DataReceived):
                data.extend(ev.data)
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.TrailersReceived):
                trailers = {_text(k): _text(v) for k, v in ev.headers}
            elif isinstance(ev, h2.events.PingAckReceived):
                acked = ev.ping_data == b"pingpong"
            elif isinstance(ev, h2.events.StreamEnded):
                ended = True
            elif isinstance(ev, h2.events.ResponseReceived) and any(
                _text(k) == "grpc-status" for k, _ in ev.headers
            ):
                trailers = {_text(k): _text(v) for k, v in ev.headers}
        sock.sendall(conn.data_to_send())
        return ended

    while pending:  # as much as the server's windows allow, then read its credit
        room = min(conn.local_flow_control_window(sid), 8000 + (pad + 1 if pad else 0))
        n = min(len(pending), room - (pad + 1 if pad else 0))
        if n > 0:
            conn.send_data(sid, bytes(pending[:n]), pad_length=pad or None)
            del pending[:n]
            sock.sendall(conn.data_to_send())
            continue
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the connection"
        done = handle(chunk) or done
    conn.end_stream(sid)
    sock.sendall(conn.data_to_send())
    while not done or not acked:
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the connection"
        done = handle(chunk) or done
    assert acked
    conn.close_connection()
    sock.sendall(conn.data_to_send())
    sock.close()
    return bytes(data), trailers


def unframe(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n = struct.unpack_from(">I", data, pos + 1)[0]
        out.append(data[pos + 5 : pos + 5 + n])
        pos += 5 + n
    return out


async def test_the_h2_library_makes_calls(echo: Any) -> None:
    _, _, port = echo
    msgs = [b"a", b"b" * 100_000, b"c" * 20]
    data, trailers = await asyncio.to_thread(h2_call, port, msgs)
    assert unframe(data) == msgs and trailers["grpc-status"] == "0"
    data, trailers = await asyncio.to_thread(h2_call, port, msgs, pad=17)  # padded DATA
    assert unframe(data) == msgs and trailers["grpc-status"] == "0"
    check = health_pb2.HealthCheckRequest(service="").SerializeToString()
    data, trailers = await asyncio.to_thread(h2_call, port, [check], path=CHECK)
    assert health_pb2.HealthCheckResponse.FromString(unframe(data)[0]).status == 1


async def test_settings_are_advertised(echo: Any) -> None:
    _, _, port = echo

    def first_settings() -> dict[int, int]:
        p = Peer(port)
        p.close()
        payload = next(pl for k, fl, _, pl in p.frames if k == f.SETTINGS and not fl & f.ACK)
        return {k: v for k, v in struct.iter_unpack(">HI", payload)}

    got = await asyncio.to_thread(first_settings)
    assert got[f.S_MAX_CONCURRENT_STREAMS] == 1000
    assert got[f.S_MAX_HEADER_LIST_SIZE] == 64 << 10
    assert got[f.S_INITIAL_WINDOW_SIZE] == 1 << 24
    assert got[f.S_ENABLE_PUSH] == 0


# -- what the RFC says to refuse -----------------------------------------------------------------
U32 = struct.Struct(">I")
OPEN = "open"  # stream 1 opened on PROCESS first (held: its session does not answer)


def _open(p: Peer) -> bytes:
    return p.headers(1)


CASES: dict[str, tuple[Callable[[Peer], bytes], str]] = {
    "PING of 7 bytes": (lambda p: frame(f.PING, 0, 0, b"1234567"), "GOAWAY FRAME_SIZE_ERROR"),
    "PING on a stream": (lambda p: frame(f.PING, 0, 1, b"12345678"), "GOAWAY PROTOCOL_ERROR"),
    "RST_STREAM of 3 bytes": (
        lambda p: _open(p) + frame(f.RST_STREAM, 0, 1, b"\0\0\0"),
        "GOAWAY FRAME_SIZE_ERROR",
    ),
    "RST_STREAM on stream 0": (lambda p: frame(f.RST_STREAM, 0, 0, U32.pack(8)), "GOAWAY PROTOCOL_ERROR"),
    "RST_STREAM on an idle stream": (
        lambda p: frame(f.RST_STREAM, 0, 5, U32.pack(8)),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "WINDOW_UPDATE of 3 bytes": (
        lambda p: frame(f.WINDOW_UPDATE, 0, 0, b"\0\0\1"),
        "GOAWAY FRAME_SIZE_ERROR",
    ),
    "WINDOW_UPDATE of 0 on the connection": (
        lambda p: frame(f.WINDOW_UPDATE, 0, 0, U32.pack(0)),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "WINDOW_UPDATE of 0 on a stream": (
        lambda p: _open(p) + frame(f.WINDOW_UPDATE, 0, 1, U32.pack(0)),
        "RST PROTOCOL_ERROR",
    ),
    "stream window past 2^31-1": (
        lambda p: _open(p) + frame(f.WINDOW_UPDATE, 0, 1, U32.pack(0x7FFFFFFF)),
        "RST FLOW_CONTROL_ERROR",
    ),
    "connection window past 2^31-1": (
        lambda p: frame(f.WINDOW_UPDATE, 0, 0, U32.pack(0x7FFFFFFF)),
        "GOAWAY FLOW_CONTROL_ERROR",
    ),
    "WINDOW_UPDATE on an idle stream": (
        lambda p: frame(f.WINDOW_UPDATE, 0, 9, U32.pack(1)),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "SETTINGS of 5 bytes": (lambda p: frame(f.SETTINGS, 0, 0, b"\0" * 5), "GOAWAY FRAME_SIZE_ERROR"),
    "SETTINGS ACK with a payload": (
        lambda p: frame(f.SETTINGS, f.ACK, 0, b"\0" * 6),
        "GOAWAY FRAME_SIZE_ERROR",
    ),
    "SETTINGS on a stream": (lambda p: frame(f.SETTINGS, 0, 1), "GOAWAY PROTOCOL_ERROR"),
    "SETTINGS initial window 2^31": (
        lambda p: frame(f.SETTINGS, 0, 0, settings(initial_window=1 << 31)),
        "GOAWAY FLOW_CONTROL_ERROR",
    ),
    "SETTINGS raising a stream window past 2^31-1": (
        lambda p: (
            _open(p)
            + frame(f.WINDOW_UPDATE, 0, 1, U32.pack(0x7FFFFFFF - 65_535))
            + frame(f.SETTINGS, 0, 0, settings(initial_window=0x7FFFFFFF))
        ),
        "GOAWAY FLOW_CONTROL_ERROR",
    ),
    "SETTINGS max frame size 100": (
        lambda p: frame(f.SETTINGS, 0, 0, settings(max_frame=100)),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "SETTINGS enable push 2": (lambda p: frame(f.SETTINGS, 0, 0, settings(push=2)), "GOAWAY PROTOCOL_ERROR"),
    "SETTINGS with 100 entries": (
        lambda p: frame(f.SETTINGS, 0, 0, settings(push=0) * 100),
        "GOAWAY ENHANCE_YOUR_CALM",
    ),
    "PRIORITY of 4 bytes": (lambda p: frame(f.PRIORITY, 0, 3, b"\0\0\0\1"), "RST FRAME_SIZE_ERROR"),
    "PRIORITY on stream 0": (lambda p: frame(f.PRIORITY, 0, 0, b"\0\0\0\1\1"), "GOAWAY PROTOCOL_ERROR"),
    "PRIORITY on itself": (lambda p: frame(f.PRIORITY, 0, 3, U32.pack(3) + b"\1"), "RST PROTOCOL_ERROR"),
    "HEADERS on an even stream": (lambda p: p.headers(2), "GOAWAY PROTOCOL_ERROR"),
    "HEADERS on stream 0": (lambda p: p.headers(0), "GOAWAY PROTOCOL_ERROR"),
    "stream ids decreasing": (lambda p: p.headers(5) + p.headers(3), "GOAWAY PROTOCOL_ERROR"),
    "HEADERS depending on itself": (
        lambda p: frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, U32.pack(1) + b"\1" + b"\x82"),
        "RST PROTOCOL_ERROR",
    ),
    "trailers without END_STREAM": (lambda p: _open(p) + p.headers(1), "RST PROTOCOL_ERROR"),
    "DATA on stream 0": (lambda p: frame(f.DATA, 0, 0, b"x"), "GOAWAY PROTOCOL_ERROR"),
    "DATA on an idle stream": (lambda p: frame(f.DATA, 0, 7, b"x"), "GOAWAY PROTOCOL_ERROR"),
    "DATA after END_STREAM": (
        lambda p: _open(p) + frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")) + frame(f.DATA, 0, 1, b"y"),
        "RST STREAM_CLOSED",
    ),
    "DATA with padding past its end": (
        lambda p: _open(p) + frame(f.DATA, f.PADDED, 1, b"\x09" + b"x" * 4),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "PUSH_PROMISE from a client": (
        lambda p: frame(f.PUSH_PROMISE, f.END_HEADERS, 1, U32.pack(2)),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "CONTINUATION without HEADERS": (
        lambda p: frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "a header block interrupted": (
        lambda p: frame(f.HEADERS, 0, 1, b"\x82") + frame(f.PING, 0, 0, b"12345678"),
        "GOAWAY PROTOCOL_ERROR",
    ),
    "HPACK garbage": (
        lambda p: frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"),
        "GOAWAY COMPRESSION_ERROR",
    ),
    "GOAWAY of 4 bytes": (lambda p: frame(f.GOAWAY, 0, 0, U32.pack(0)), "GOAWAY FRAME_SIZE_ERROR"),
    "a frame above SETTINGS_MAX_FRAME_SIZE": (
        lambda p: frame(f.PING, 0, 0, b"x" * 16_385),
        "GOAWAY FRAME_SIZE_ERROR",
    ),
    "a 2 MiB message, limit 1 MiB": (
        lambda p: _open(p) + frame(f.DATA, 0, 1, b"\0" + U32.pack(2 * MIB)),
        "grpc-status 8",
    ),
    "a compressed message": (
        lambda p: _open(p) + frame(f.DATA, 0, 1, b"\1" + U32.pack(1) + b"x"),
        "grpc-status 12",
    ),
    "a stream ending inside a message": (
        lambda p: _open(p) + frame(f.DATA, f.END_STREAM, 1, b"\0" + U32.pack(10) + b"x"),
        "grpc-status 13",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_refused_as_the_rfc_says(echo: Any, case: str) -> None:
    servicer, _, port = echo
    servicer.release.clear()  # calls stay open: stream states are what the case says
    make, expected = CASES[case]

    def run() -> str:
        p = Peer(port)
        p.send(make(p))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and expected not in p.outcome() and not p.closed.is_set():
            time.sleep(0.01)
        p.close()
        return p.outcome()

    outcome = await asyncio.to_thread(run)
    assert expected in outcome
    servicer.release.set()
    data, _trailers = await asyncio.to_thread(h2_call, port, [b"after"])  # the server is fine
    assert unframe(data) == [b"after"]


async def test_the_first_frame_must_be_settings(echo: Any) -> None:
    _, _, port = echo

    def run() -> str:
        p = Peer(port, preface=False)
        p.send(f.PREFACE + frame(f.PING, 0, 0, b"12345678"))
        p.wait_closed(3)
        p.close()
        return p.outcome()

    assert "GOAWAY PROTOCOL_ERROR" in await asyncio.to_thread(run)


async def test_unknown_frame_types_are_ignored(echo: Any) -> None:
    _, _, port = echo

    def run() -> str:
        p = Peer(port)
        p.send(frame(0x42, 0xFF, 0, b"whatever") + frame(0xFA, 0, 1, b"") + p.headers(1)
               + frame(f.DATA, f.END_STREAM, 1, grpc_message(b"ok")))  # fmt: skip
        p.wait_for(f.HEADERS, 3)
        time.sleep(0.2)
        p.close()
        return p.outcome()

    assert await asyncio.to_thread(run) == "grpc-status 0 x1"


async def test_a_stream_past_its_window_is_reset() -> None:
    """Messages queued behind a busy call are not credited: a peer that keeps sending anyway runs
    past the stream window and the stream is reset FLOW_CONTROL_ERROR (the connection goes on)."""
    servicer, server, port = await _serve(H2Limits(max_message_bytes=1 * MIB))
    servicer.release.clear()

    def run() -> str:
        p = Peer(port)
        p.send(p.headers(1) + frame(f.DATA, 0, 1, grpc_message(b"first")))
        msg = grpc_message(b"m" * 16_000)
        for _ in range((17 * MIB) // len(msg)):
            if not p.data_in_window(1, msg, timeout=3) or p.resets():
                break
        p.wait_for(f.RST_STREAM, 3)
        p.close()
        return p.outcome()

    try:
        assert "RST FLOW_CONTROL_ERROR" in await asyncio.to_thread(run)
    finally:
        servicer.release.set()
        await server.stop(0.0)


async def test_too_many_streams_are_refused() -> None:
    servicer, server, port = await _serve(H2Limits(max_concurrent_streams=10))
    servicer.release.clear()

    def run() -> str:
        p = Peer(port)
        p.send(b"".join(p.headers(2 * i + 1) for i in range(15)))
        p.wait_for(f.RST_STREAM, 3)
        time.sleep(0.1)
        p.close()
        return p.outcome()

    try:
        assert await asyncio.to_thread(run) == "RST REFUSED_STREAM x5"
    finally:
        servicer.release.set()
        await server.stop(0.0)


async def test_a_header_list_over_the_limit_is_refused() -> None:
    _, server, port = await _serve(H2Limits(max_header_list_bytes=1024))

    def run() -> str:
        p = Peer(port)
        block = bytes(p.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PROCESS),
                                        (":authority", "epp"), ("x-big", "v" * 2000)]))  # fmt: skip
        p.send(frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block))
        p.wait_for(f.HEADERS, 3)
        p.close()
        return p.outcome()

    try:
        assert "grpc-status 8" in await asyncio.to_thread(run)
    finally:
        await server.stop(0.0)


# -- time ----------------------------------------------------------------------------------------
async def test_a_silent_client_is_closed_after_the_handshake_timeout() -> None:
    _, server, port = await _serve(H2Limits(handshake_timeout=0.3))

    def run() -> tuple[str, float]:
        p = Peer(port, preface=False)
        p.send(f.PREFACE[:10])
        started = time.monotonic()
        p.wait_closed(5)
        p.close()
        return p.outcome(), time.monotonic() - started

    try:
        outcome, took = await asyncio.to_thread(run)
        assert "GOAWAY SETTINGS_TIMEOUT" in outcome and took < 2
    finally:
        await server.stop(0.0)


async def test_an_idle_connection_is_closed() -> None:
    _, server, port = await _serve(H2Limits(idle_timeout=0.3))

    def run() -> str:
        p = Peer(port)
        p.wait_closed(5)
        p.close()
        return p.outcome()

    try:
        assert await asyncio.to_thread(run) == "GOAWAY NO_ERROR"
    finally:
        await server.stop(0.0)


async def test_keepalive_pings_and_closes_a_dead_peer() -> None:
    _, server, port = await _serve(H2Limits(keepalive_time=0.2, keepalive_timeout=0.3))

    def run() -> tuple[bool, bool]:
        p = Peer(port)  # its reader does not answer PINGs: the server hears nothing more
        pinged = p.wait_for(f.PING, 3)
        closed = p.wait_closed(3)
        p.close()
        return pinged, closed

    def alive() -> bool:
        p = Peer(port)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # answer every PING
            for k, fl, _, pl in list(p.frames):
                if k == f.PING and not fl & f.ACK:
                    p.send(frame(f.PING, f.ACK, 0, pl))
            time.sleep(0.05)
        ok = not p.closed.is_set()
        p.close()
        return ok

    try:
        assert await asyncio.to_thread(run) == (True, True)
        assert await asyncio.to_thread(alive)
    finally:
        await server.stop(0.0)


async def test_a_peer_that_pings_after_goaway_does_not_break_the_shutdown() -> None:
    """Stopping half-closes an idle connection (GOAWAY, then FIN) and waits for the peer to close.
    A peer that keeps sending PINGs meanwhile gets no ACK: the transport refuses writes after
    its FIN, and neither the reply path nor the final abort may raise (a CI run failed on it)."""
    _, server, port = await _serve(H2Limits())
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

    def run(p: Peer) -> tuple[str, int]:
        assert p.wait_for(f.GOAWAY, 5)
        sent, deadline = 0, time.monotonic() + 5
        while time.monotonic() < deadline and p.send(frame(f.PING, 0, 0, b"afterbye"), timeout=1):
            sent += 1  # our reader saw the server's FIN; we go on until the server closes
            time.sleep(0.01)
        p.close()
        return p.outcome(), sent

    try:
        p = await asyncio.to_thread(Peer, port)  # handshaken: the server holds the connection
        peer = asyncio.ensure_future(asyncio.to_thread(run, p))
        await server.stop(0.5)
        outcome, sent = await peer
    finally:
        loop.set_exception_handler(None)
    assert outcome == "GOAWAY NO_ERROR" and sent > 1
    assert not errors, errors


# -- linear cost ---------------------------------------------------------------------------------
async def test_a_64_mib_message_costs_linear_time_and_health_answers_meanwhile() -> None:
    """One 64 MiB message (limit raised) is read at tens of MiB/s, and health checks on another
    connection answer while it streams in (before: 1.4 MiB/s at 100% CPU, health timing out)."""
    _, server, port = await _serve(H2Limits(max_message_bytes=80 * MIB))
    msg = grpc_message(health_pb2.HealthCheckRequest(service="s" * (64 * MIB)).SerializeToString())
    health_latencies: list[float] = []
    answered_at: list[float] = []  # monotonic time each health answer arrived
    big_started: list[float] = []

    def send_big() -> tuple[float, str]:
        p = Peer(port)
        p.send(p.headers(1, CHECK))
        started = time.monotonic()
        big_started.append(started)
        view = memoryview(msg)
        for off in range(0, len(msg), 16_384):
            last = off + 16_384 >= len(msg)
            assert p.data_in_window(
                1, bytes(view[off : off + 16_384]), f.END_STREAM if last else 0, timeout=30
            )
        p.wait_for(f.HEADERS, 30)
        took = time.monotonic() - started
        time.sleep(0.1)
        p.close()
        return took, p.outcome()

    async def probe(stop: asyncio.Event) -> None:
        check = health_pb2.HealthCheckRequest(service="").SerializeToString()
        while not stop.is_set():
            t0 = time.monotonic()
            _data, _ = await asyncio.to_thread(h2_call, port, [check], path=CHECK)
            answered_at.append(time.monotonic())
            health_latencies.append(answered_at[-1] - t0)
            await asyncio.sleep(0.01)

    stop = asyncio.Event()
    prober = asyncio.create_task(probe(stop))
    try:
        took, outcome = await asyncio.to_thread(send_big)
    finally:
        stop.set()
        await prober
        await server.stop(0.0)
    assert "grpc-status 0" in outcome
    assert 64 / took > 15, f"{64 / took:.1f} MiB/s"
    # Health was answered *while* the message streamed in, more than once: a loop stuck in the
    # big message would answer at most the probe in flight, once it is done.  (Counted, not timed:
    # each probe's latency depends on what else the machine runs; on an idle machine the whole
    # message takes ~0.3 s, so a few probes fit, not many.)
    streaming = [t for t in answered_at if big_started[0] < t < big_started[0] + took]
    assert len(streaming) >= 2, (len(streaming), took, max(health_latencies, default=None))


# -- retiring a connection (the workers' rebalancing) -------------------------------------------
async def test_retire_moves_the_client_without_refusing_a_stream_it_sent_meanwhile() -> None:
    """``Connection.retire``: GOAWAY naming the largest stream id and a PING; a stream the client
    opens before it has read that GOAWAY is served; once the PING's ACK comes back, the real
    GOAWAY names that stream, and with nothing open the server half-closes."""
    _, server, port = await _serve(H2Limits())
    check = grpc_message(health_pb2.HealthCheckRequest().SerializeToString())

    def client(p: Peer) -> tuple[list[int], bool]:
        assert p.wait_for(f.PING, 5)
        p.send(p.headers(1, CHECK) + frame(f.DATA, f.END_STREAM, 1, check))  # crossed the GOAWAY
        deadline = time.monotonic() + 5
        while not p.grpc_statuses() and time.monotonic() < deadline:
            time.sleep(0.01)
        ping = next(pl for k, fl, _, pl in p.frames if k == f.PING and not fl & f.ACK)
        p.send(frame(f.PING, f.ACK, 0, ping))
        closed = p.wait_closed(5)
        lasts = [int.from_bytes(pl[:4], "big") for k, _, _, pl in p.frames if k == f.GOAWAY]
        return lasts, closed

    try:
        p = await asyncio.to_thread(Peer, port)
        assert await asyncio.to_thread(p.handshaken.wait, 5)  # the server's SETTINGS: it holds the connection
        (conn,) = server.connections
        assert conn.retire()
        assert not conn.retire()  # once
        lasts, closed = await asyncio.to_thread(client, p)
        assert p.grpc_statuses() == {"0": 1}  # served, not refused
        assert lasts == [0x7FFFFFFF, 1]
        assert closed
        p.close()
    finally:
        await server.stop(0.0)
