"""The benchmark client and upstream: HTTP/1.1 framing, SSE counting, and open-loop latency accounting."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import pytest

from bench.httpload import Pool, open_loop, percentile, post
from bench.upstream import _Conn


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(functools.partial(_Conn, b"up-0", 0.0), "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize(
    ("request_bytes", "status", "events"),
    [
        pytest.param(post("/v1/chat/completions", b'{"max_tokens":3}'), 200, 0, id="json-content-length"),
        pytest.param(
            post("/v1/chat/completions", b'{"max_tokens":5,"stream":true}'), 200, 7, id="sse-chunked"
        ),
        pytest.param(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b'5\r\n{"max\r\n19\r\n_tokens":2,"stream":true}\r\n0\r\n\r\n',
            200,
            4,
            id="chunked-request-body",
        ),
        pytest.param(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n", 200, 0, id="metrics"),
        pytest.param(b"GET /tokenize HTTP/1.1\r\nhost: x\r\n\r\n", 404, 0, id="unknown-404"),
    ],
)
async def test_round_trip(upstream: int, request_bytes: bytes, status: int, events: int) -> None:
    """The client reads status and body of each framing, and counts SSE events (tokens + usage + DONE)."""
    pool = Pool("127.0.0.1", upstream, limit=2)
    try:
        for _ in range(2):  # the second request reuses the keep-alive connection
            r = await pool.send(request_bytes, timeout=5)
            assert r.status == status
            assert r.events == events
            assert r.body_bytes > 0
            assert r.done >= r.first_byte > 0
    finally:
        pool.close()


async def test_open_loop_charges_queueing_to_the_path() -> None:
    """With one connection and a 20 ms server, later requests' latency includes their wait (no omission)."""

    closed = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.02)  # the service time under test, not synchronisation
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass  # the client closed its connection
        finally:
            writer.close()
            closed.set()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool("127.0.0.1", port, limit=1)
    try:
        get = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        run = await open_loop(pool, [get], rate=200.0, duration=0.1, seed=1)
    finally:
        pool.close()
        await asyncio.wait_for(closed.wait(), 5)
        server.close()
        await server.wait_closed()
    lat = sorted(s.latency for s in run.ok)
    assert run.offered == len(run.ok) >= 10
    # Served one at a time, so the n-th request finished no earlier than n x 20 ms after the start;
    # it was scheduled within the first 0.1 s, hence the slowest waited well beyond one service time.
    assert lat[-1] >= 0.02 * len(lat) - 0.1
    assert lat[0] >= 0.019


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([3.0, 1.0, 2.0], 50, 2.0, id="median"),
        pytest.param(list(range(101)), 99, 99, id="p99-nearest-rank"),
        pytest.param([5.0], 90, 5.0, id="single"),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    """Nearest-rank percentiles of unsorted input."""
    assert percentile(values, q) == expected
