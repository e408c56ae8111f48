"""bench/extproc_load.c (through bench/extproc_native): the Python closed loop's bytes, in C.

A scripted HTTP/2 peer on a real socket answers each stream as the EPP would (routed, refused
or reset, its replies written byte by byte or whole), and records every frame the client sent;
the same requests then go to a real EPP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bench import extproc_client as xc
from bench.extproc_native import NativeClosedLoop, order, spec
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.e2e.conftest import QUICK_STOP

ROUTED = b"\x0a\x00"  # ProcessingResponse.request_headers (field 1), empty
REFUSED = b"\x3a\x00"  # ProcessingResponse.immediate_response (field 7), empty


def grpc(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class ScriptedPeer(asyncio.Protocol):
    """The server side of one connection: records (type, flags, stream, payload) per frame and
    answers each stream's first DATA frame with ``verdict(stream)``: "routed" (a reply, then
    trailers once the second phase ends the stream), "refused" (an immediate response and the
    trailers at once) or "reset" (RST_STREAM)."""

    def __init__(
        self, frames: list[tuple[int, int, int, bytes]], verdict: Callable[[int], str], *, trickle: bool
    ):
        self.frames = frames
        self.verdict = verdict
        self.trickle = trickle
        self.buf = b""
        self.preface = False
        self.answered: set[int] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.send(xc.frame(xc.SETTINGS, 0, 0) + xc.frame(xc.PING, 0, 0, b"12345678"))

    def send(self, data: bytes) -> None:
        if self.trickle:  # one byte a write: the client must reassemble every frame
            for i in range(len(data)):
                self.transport.write(data[i : i + 1])
        else:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.preface:
            if len(self.buf) < len(xc.PREFACE):
                return
            assert self.buf.startswith(xc.PREFACE)
            self.buf = self.buf[len(xc.PREFACE) :]
            self.preface = True
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                return
            kind, flags, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big")
            payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
            self.frames.append((kind, flags, sid, payload))
            if kind == xc.DATA and sid not in self.answered:
                self.answered.add(sid)
                self.answer(sid)
            elif kind == xc.DATA and flags & xc.END_STREAM:
                self.send(xc.frame(xc.HEADERS, xc.END_HEADERS | xc.END_STREAM, sid, b"\x88"))

    def answer(self, sid: int) -> None:
        verdict = self.verdict(sid)
        head = xc.frame(xc.HEADERS, xc.END_HEADERS, sid, b"\x88")
        if verdict == "reset":
            self.send(head + xc.frame(xc.RST_STREAM, 0, sid, b"\x00\x00\x00\x08"))
        elif verdict == "refused":
            trailers = xc.frame(xc.HEADERS, xc.END_HEADERS | xc.END_STREAM, sid, b"\x88")
            self.send(head + xc.frame(xc.DATA, 0, sid, grpc(REFUSED)) + trailers)
        else:
            self.send(head + xc.frame(xc.DATA, 0, sid, grpc(ROUTED)))


async def _against_peer(
    verdict: Callable[[int], str], *, trickle: bool, streams: int, seconds: float
) -> tuple[xc.Stats, list[tuple[int, int, int, bytes]], list[xc.Variant], int]:
    frames: list[tuple[int, int, int, bytes]] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ScriptedPeer(frames, verdict, trickle=trickle), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    vs = xc.variants([f"prompt number {i}" for i in range(5)], "m")
    try:
        async with NativeClosedLoop("127.0.0.1", port, vs, connections=1, concurrency=streams) as load:
            stats = await load.run(seconds)
    finally:
        server.close()
        await server.wait_closed()
    return stats, frames, vs, port


async def test_every_stream_carries_the_python_clients_bytes_in_its_order() -> None:
    stats, frames, vs, port = await _against_peer(lambda sid: "routed", trickle=False, streams=4, seconds=0.2)
    assert stats.routed >= 8 and (stats.refused, stats.failed) == (0, 0)
    assert len(stats.latencies) == stats.routed and all(0 < t < 5 for t in stats.latencies)
    # the Python client's connection setup: SETTINGS (window 2^31-1, no push), then the window
    assert frames[0] == (xc.SETTINGS, 0, 0, bytes.fromhex("00047fffffff") + bytes.fromhex("000200000000"))
    assert frames[1] == (xc.WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65535).to_bytes(4, "big"))
    assert (xc.SETTINGS, xc.ACK, 0, b"") in frames and (xc.PING, xc.ACK, 0, b"12345678") in frames
    # the k-th stream opened (id 2k + 1) sends ClosedLoop's k-th draw: headers, phase 1, phase 2
    drawn = order(len(vs))
    python = xc.ClosedLoop(vs, deadline=0.0)  # the Python client's draw, with the same seed
    assert [next(python.variants) for _ in drawn] == [vs[i] for i in drawn]
    by_stream: dict[int, list[tuple[int, int, bytes]]] = {}
    for kind, flags, sid, payload in frames:
        if sid:
            by_stream.setdefault(sid, []).append((kind, flags, payload))
    ended = [sid for sid, fs in by_stream.items() if len(fs) == 3]
    assert len(ended) >= stats.routed
    for sid in ended:
        v = vs[drawn[(sid - 1) // 2 % len(drawn)]]  # the order cycles
        headers, data1, data2 = by_stream[sid]
        assert headers == (xc.HEADERS, xc.END_HEADERS, xc.header_block(f"127.0.0.1:{port}"))
        assert data1 == (xc.DATA, 0, v.phase1)
        assert data2 == (xc.DATA, xc.END_STREAM, v.phase2)


@pytest.mark.parametrize("trickle", [False, True], ids=["whole", "byte-by-byte"])
async def test_refusals_and_resets_are_counted_apart_and_replaced(trickle: bool) -> None:
    def verdict(sid: int) -> str:
        return ("routed", "refused", "reset")[(sid // 2) % 3]

    stats, frames, _, _ = await _against_peer(verdict, trickle=trickle, streams=3, seconds=0.3)
    assert stats.routed > 0 and stats.refused > 0 and stats.failed > 0
    assert len(stats.latencies) == stats.routed
    # every stream's outcome is its verdict: refused and reset streams never send phase 2
    second = {sid for kind, flags, sid, _ in frames if kind == xc.DATA and flags & xc.END_STREAM}
    assert second and all(verdict(sid) == "routed" for sid in second)
    opened = {sid for kind, _, sid, _ in frames if kind == xc.HEADERS}
    assert stats.routed + stats.refused + stats.failed == len(opened)


class DrainingPeer(ScriptedPeer):
    """A ScriptedPeer that, on the first connection, answers GOAWAY when stream ``at`` opens,
    naming the stream before it as the last it will process (the EPP retiring a connection)."""

    def __init__(self, frames: list[tuple[int, int, int, bytes]], at: int | None) -> None:
        super().__init__(frames, lambda sid: "routed", trickle=False)
        self.at = at
        self.last = 2**31 - 1
        self.closed = asyncio.get_running_loop().create_future()

    def answer(self, sid: int) -> None:
        if self.at is not None and sid >= self.at and self.last == 2**31 - 1:
            self.last = self.at - 2
            self.send(xc.frame(xc.GOAWAY, 0, 0, self.last.to_bytes(4, "big") + bytes(4)))
        if sid <= self.last:
            super().answer(sid)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def test_goaway_drains_the_connection_and_the_streams_go_on_on_a_new_one() -> None:
    """Streams the GOAWAY names finish; the one past it fails; the connection closes once
    drained, and the replacements open on a new connection (the EPP's workers retire a
    connection this way to even out their shares)."""
    peers: list[DrainingPeer] = []

    def peer() -> DrainingPeer:
        peers.append(DrainingPeer([], at=7 if not peers else None))
        return peers[-1]

    loop = asyncio.get_running_loop()
    server = await loop.create_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    vs = xc.variants([f"prompt number {i}" for i in range(5)], "m")
    try:
        async with NativeClosedLoop("127.0.0.1", port, vs, connections=1, concurrency=4) as load:
            stats = await load.run(0.3)
    finally:
        server.close()
        await server.wait_closed()
    first = peers[0]
    assert first.closed.done()  # the client closed it, drained
    opened_first = sorted({sid for kind, _, sid, _ in first.frames if kind == xc.HEADERS and sid})
    assert opened_first == [1, 3, 5, 7]  # nothing opened after the GOAWAY
    ended_first = {sid for kind, flags, sid, _ in first.frames if kind == xc.DATA and flags & xc.END_STREAM}
    assert ended_first == {1, 3, 5}  # the named streams finished
    assert stats.failed == 1  # stream 7, past the GOAWAY
    assert len(peers) == 2 and stats.routed > 3  # the rest went on on the new connection
    opened = sum(len({sid for kind, _, sid, _ in p.frames if kind == xc.HEADERS and sid}) for p in peers)
    assert stats.routed + stats.failed == opened  # every stream opened is counted once


def test_a_phase_larger_than_one_frame_is_refused_when_the_spec_is_written() -> None:
    big = xc.Variant(phase1=b"x" * 20000, phase2=b"")
    with pytest.raises(ValueError, match="more than one DATA frame"):
        spec(b"block", [big])


@pytest.mark.e2e
async def test_both_closed_loops_keep_every_stream_busy_against_a_real_epp() -> None:
    """The Python closed loop and the C one against the same EPP: every stream replaced, nothing
    failed; the C client's runs each count their own, and it tells the EPP's refusals."""
    async with (
        SimFleet(2, "--time-scale", "0.02") as fleet,
        EppProcess(f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1", QUICK_STOP) as epp,
    ):
        vs = xc.variants([f"prompt {i}" for i in range(8)], "mock-model")
        python = await xc.closed_loop(
            "127.0.0.1", epp.grpc_port, vs, connections=2, concurrency=8, seconds=0.5
        )
        async with NativeClosedLoop("127.0.0.1", epp.grpc_port, vs, connections=2, concurrency=8) as load:
            first = await load.run(0.3)
            second = await load.run(0.3)  # one process, several runs: each counts its own
        bad = xc.variants(['broken "json'], "mock-model")  # the EPP answers 400 itself
        async with NativeClosedLoop("127.0.0.1", epp.grpc_port, bad, connections=1, concurrency=2) as load:
            refused = await load.run(0.2)
    for st in (python, first, second):
        assert st.routed > 8  # every stream was replaced at least once
        assert (st.refused, st.failed) == (0, 0)
        assert len(st.latencies) == st.routed
    assert refused.refused > 0 and (refused.routed, refused.failed) == (0, 0)
