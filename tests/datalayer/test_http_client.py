"""The scrape HTTP client against raw servers: framing, keep-alive, errors and bounds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from epp.datalayer.http_client import ScrapeClient, ScrapeError

Reply = Sequence[bytes]  # chunks written back for one request (b"" = close the connection)


class RawServer:
    """Answers each request on a connection with the next canned reply, chunk by chunk."""

    def __init__(self, replies: Callable[[int], Reply]) -> None:
        self._replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.got_request = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                self.got_request.set()
                for chunk in self._replies(len(self.requests)):
                    if chunk == b"":
                        writer.close()
                        return
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


MakeRaw = Callable[[Callable[[int], Reply]], Awaitable[RawServer]]


@pytest.fixture
async def raw() -> AsyncIterator[MakeRaw]:
    made: list[RawServer] = []

    async def make(replies: Callable[[int], Reply]) -> RawServer:
        s = await RawServer(replies).start()
        made.append(s)
        return s

    yield make
    for s in made:
        await s.stop()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        pytest.param([OK], b"hello", id="content-length-one-read"),
        pytest.param([OK[:10], OK[10:30], OK[30:]], b"hello", id="content-length-split"),
        pytest.param(
            [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"3;ext=1\r\nhel\r\n",
                b"2\r\nlo\r\n0\r\n\r\n",
            ],
            b"hello",
            id="chunked",
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"],
            b"hello",
            id="chunked-trailers",
        ),
        pytest.param([b"HTTP/1.1 100 Continue\r\n\r\n", OK], b"hello", id="interim-100"),
        pytest.param([b"HTTP/1.0 200 OK\r\n\r\nhel", b"lo", b""], b"hello", id="read-until-close"),
        pytest.param([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], b"", id="empty"),
    ],
)
async def test_framing(raw: MakeRaw, reply: Reply, body: bytes) -> None:
    """Content-Length, chunked (with extensions/trailers), 1xx and close-delimited bodies all read right."""
    server: RawServer = await raw(lambda n: reply)
    client = ScrapeClient()
    try:
        assert await client.get("127.0.0.1", server.port, "/metrics") == body
        assert server.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        pytest.param(
            [b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"], "unexpected status code 500", id="500"
        ),
        pytest.param([b"SSH-2.0-OpenSSH\r\n\r\n"], "malformed status line", id="not-http"),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"], "invalid Content-Length", id="bad-length"
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n"], "exceeds the limit of 100", id="too-big"
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"65\r\n" + b"x" * 101 + b"\r\n"],
            "larger than 100 bytes",
            id="chunked-too-big",
        ),
        pytest.param(
            [b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 150], "larger than 100 bytes", id="until-close-too-big"
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], "chunk size", id="bad-chunk"
        ),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", b""], "before the response", id="cut"
        ),
        pytest.param([b"HTTP/1.1 200 OK\r\nX" + b"y" * 70_000], "headers too large", id="huge-headers"),
    ],
)
async def test_errors(raw: MakeRaw, reply: Reply, message: str) -> None:
    """Bad statuses, malformed or oversized replies are ScrapeErrors with a clear message."""
    server: RawServer = await raw(lambda n: reply)
    client = ScrapeClient(max_body_bytes=100)
    try:
        with pytest.raises(ScrapeError, match=message):
            await client.get("127.0.0.1", server.port, "/metrics")
        # A complete error reply leaves a reusable connection; a broken one is never reused.
        assert client.idle_connections() == (1 if message.startswith("unexpected status") else 0)
    finally:
        await client.close()


async def test_keep_alive_reuses_one_connection(raw: MakeRaw) -> None:
    """Sequential scrapes of one host share one kept-alive connection."""
    server: RawServer = await raw(lambda n: [OK])
    client = ScrapeClient()
    try:
        for _ in range(5):
            assert await client.get("127.0.0.1", server.port, "/m") == b"hello"
        assert (server.connections, len(server.requests), client.idle_connections()) == (1, 5, 1)
        client.forget("127.0.0.1", server.port)
        assert client.idle_connections() == 0
    finally:
        await client.close()


async def test_connection_close_header_is_honoured(raw: MakeRaw) -> None:
    """``Connection: close`` replies are not reused."""
    reply = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server: RawServer = await raw(lambda n: [reply, b""])
    client = ScrapeClient()
    try:
        assert await client.get("127.0.0.1", server.port, "/m") == b"ok"
        assert await client.get("127.0.0.1", server.port, "/m") == b"ok"
        assert server.connections == 2
    finally:
        await client.close()


async def test_reused_connection_dropped_before_reply_is_retried(raw: MakeRaw) -> None:
    """A kept-alive connection that dies before any reply byte is retried once on a new connection."""
    # Request 2 arrives on the reused connection and the server hangs up without answering.
    server: RawServer = await raw(lambda n: [b""] if n == 2 else [OK])
    client = ScrapeClient()
    try:
        assert await client.get("127.0.0.1", server.port, "/m") == b"hello"
        assert await client.get("127.0.0.1", server.port, "/m") == b"hello"
        assert (server.connections, len(server.requests)) == (2, 3)
    finally:
        await client.close()


async def test_cancellation_closes_the_connection(raw: MakeRaw) -> None:
    """A cancelled scrape (deadline) drops its connection, so a late reply is never read as the next one."""

    def replies(n: int) -> Reply:
        return [OK] if n > 1 else []  # the first request is never answered

    server: RawServer = await raw(replies)
    client = ScrapeClient()
    try:
        task = asyncio.create_task(client.get("127.0.0.1", server.port, "/m"))
        await server.got_request.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.idle_connections() == 0
        assert await client.get("127.0.0.1", server.port, "/m") == b"hello"
        assert server.connections == 2
    finally:
        await client.close()


async def test_connect_refused() -> None:
    """A port nobody listens on is a ScrapeError naming the address."""
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    client = ScrapeClient()
    with pytest.raises(ScrapeError, match=f"connect to 127.0.0.1:{port} failed"):
        await client.get("127.0.0.1", port, "/m")
    await client.close()


async def test_ipv6_host_header() -> None:
    """IPv6 literals are bracketed in the Host header."""
    client = ScrapeClient()
    assert b"Host: [::1]:9\r\n" in client._request_bytes("::1", 9, "/m")
    await client.close()
