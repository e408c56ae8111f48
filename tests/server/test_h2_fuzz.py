"""Hypothesis-generated frame sequences against one in-memory ``Connection``.

Whatever a peer sends: nothing escapes the read callback, what the server writes parses as
frames with a GOAWAY (if any) last, the buffer accounting adds up, and a fresh connection
still serves a call.  The default suite runs a few thousand cases in seconds; ``-m fuzz`` runs
a long one (``EPP_FUZZ_EXAMPLES``, default 100,000 sequences of up to 40 frames).
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.server.h2 import H2GrpcServer, H2Limits
from epp.server.h2 import connection as h2connection
from epp.server.h2 import frames as f
from epp.server.health import HealthServicer
from tests.server.h2peer import CHECK, PROCESS, frame, grpc_message
from tests.server.test_h2grpc import EchoServicer

U32 = struct.Struct(">I")
KNOWN_CODES = {0x0, 0x1, 0x3, 0x4, 0x6, 0x9, 0xB}


class MemoryTransport:
    """What the connection writes, and whether it closed; never pushes back."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


def block(path: str, *extra: tuple[bytes, bytes]) -> bytes:
    """A stateless header block (literals without indexing), so any sequence of them decodes."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"e"),
              (b"content-type", b"application/grpc"), *extra]  # fmt: skip
    return b"".join(f._literal(k, v) for k, v in fields)


SIDS = st.sampled_from([0, 1, 1, 3, 3, 5, 2, 7, 0x7FFFFFFF])
PAYLOADS = st.one_of(
    st.binary(max_size=24),
    st.sampled_from([block(PROCESS), block(CHECK), block("/nope"), b"\x82", b"\xff\xff\xff\xff"]),
    st.binary(max_size=60).map(grpc_message),
    st.builds(
        lambda n, tail: b"\x00" + U32.pack(n) + tail, st.integers(0, 2**32 - 1), st.binary(max_size=16)
    ),
    st.integers(0, 2**32 - 1).map(U32.pack),
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2**32 - 1)), max_size=4).map(
        lambda kv: b"".join(struct.pack(">HI", k, v) for k, v in kv)
    ),
)
FRAMES = st.tuples(
    st.sampled_from([*range(10), 0x42]),
    st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0x20, 0x25, 0xFF]),
    SIDS,
    PAYLOADS,
)
# mostly well-formed calls with noise in between, so deep states are reached
VALID = st.sampled_from(
    [
        (f.HEADERS, f.END_HEADERS, 1, block(PROCESS)),
        (f.DATA, 0, 1, grpc_message(b"hello")),
        (f.DATA, f.END_STREAM, 1, grpc_message(b"bye")),
        (f.HEADERS, f.END_HEADERS, 3, block(CHECK)),
        (f.DATA, f.END_STREAM, 3, grpc_message(b"")),
        (f.HEADERS, 0, 5, block(PROCESS)[:10]),
        (f.CONTINUATION, f.END_HEADERS, 5, block(PROCESS)[10:]),
        (f.WINDOW_UPDATE, 0, 0, U32.pack(1000)),
        (f.WINDOW_UPDATE, 0, 1, U32.pack(1000)),
        (f.RST_STREAM, 0, 1, U32.pack(8)),
        (f.PING, 0, 0, b"12345678"),
        (f.SETTINGS, 0, 0, struct.pack(">HI", f.S_INITIAL_WINDOW_SIZE, 0)),
        (f.SETTINGS, f.ACK, 0, b""),
        (f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block(PROCESS)),
    ]
)
SEQUENCES = st.lists(st.one_of(VALID, VALID, FRAMES), max_size=14)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.run_until_complete(lp.shutdown_asyncgens())
    lp.close()


def _server(release: bool) -> tuple[EchoServicer, H2GrpcServer]:
    servicer = EchoServicer()
    if not release:
        servicer.release.clear()
    limits = H2Limits(
        max_message_bytes=1 << 16, max_concurrent_streams=3, max_empty_frames=3, max_control_out=8
    )
    server = H2GrpcServer(servicer, HealthServicer(lambda: True), limits)  # type: ignore[arg-type]
    return servicer, server


def parse(out: bytes) -> list[tuple[int, int, int, bytes]]:
    frames, pos = [], 0
    while pos < len(out):
        assert len(out) - pos >= 9
        n = int.from_bytes(out[pos : pos + 3], "big")
        frames.append(
            (
                out[pos + 3],
                out[pos + 4],
                int.from_bytes(out[pos + 5 : pos + 9], "big"),
                out[pos + 9 : pos + 9 + n],
            )
        )
        assert len(frames[-1][3]) == n
        pos += 9 + n
    return frames


async def run_case(seq: list[tuple[int, int, int, bytes]], cut: int, release: bool) -> None:
    _, server = _server(release)
    conn = h2connection.Connection(server)
    t = MemoryTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    wire = f.PREFACE + frame(f.SETTINGS, 0, 0) + b"".join(frame(k, fl, sid, p) for k, fl, sid, p in seq)
    cut = min(cut, len(wire))
    for part in (wire[:cut], wire[cut:]):
        if not t.closed:
            conn.data_received(part)
        assert conn.buffered == sum(c.buffered for c in conn._streams.values()) >= 0
    for _ in range(3):
        await asyncio.sleep(0)
    conn._flush()
    frames = parse(bytes(t.out))
    goaways = [i for i, fr in enumerate(frames) if fr[0] == f.GOAWAY]
    if goaways:
        assert goaways[-1] == len(frames) - 1 or not t.closed
        for i in goaways:
            assert int.from_bytes(frames[i][3][4:8], "big") in KNOWN_CODES
        if t.closed:
            assert int.from_bytes(frames[goaways[-1]][3][4:8], "big") in KNOWN_CODES
    for _, _, sid, _ in frames:
        assert sid & 0x80000000 == 0
    conn.connection_lost(None)
    for _ in range(3):
        await asyncio.sleep(0)


async def fresh_call_works() -> None:
    servicer, server = _server(True)
    conn = h2connection.Connection(server)
    t = MemoryTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(f.PREFACE + frame(f.SETTINGS, 0, 0) + frame(f.HEADERS, f.END_HEADERS, 1, block(PROCESS))
                       + frame(f.DATA, f.END_STREAM, 1, grpc_message(b"ok")))  # fmt: skip
    await asyncio.wait_for(servicer.closed.wait(), 2)
    conn._flush()
    assert any(k == f.DATA and p == grpc_message(b"ok") for k, _, _, p in parse(bytes(t.out)))
    conn.connection_lost(None)


@settings(max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seq=SEQUENCES, cut=st.integers(0, 400), release=st.booleans())
def test_any_frame_sequence(loop: asyncio.AbstractEventLoop, seq: Any, cut: int, release: bool) -> None:
    loop.run_until_complete(run_case(seq, cut, release))


def test_a_fresh_connection_serves_after_fuzzing(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(fresh_call_works())


@pytest.mark.fuzz
@pytest.mark.timeout(3600)
@settings(
    max_examples=int(os.environ.get("EPP_FUZZ_EXAMPLES", "100000")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(seq=st.lists(st.one_of(VALID, FRAMES), max_size=40), cut=st.integers(0, 2000), release=st.booleans())
def test_any_frame_sequence_long(
    loop: asyncio.AbstractEventLoop, request: pytest.FixtureRequest, seq: Any, cut: int, release: bool
) -> None:
    expr = str(request.config.getoption("markexpr") or "")
    if "fuzz" not in expr or "not fuzz" in expr:
        pytest.skip("the long fuzz run: pytest -m fuzz")
    loop.run_until_complete(run_case(seq, cut, release))
