"""A minimal HTTP/1.1 client for scraping many endpoints often: keep-alive, bounded, no frills.

GET for the scrapes; POST for small idempotent calls on the same hosts (the precise prefix
scorer's ``/tokenize``), which would otherwise pay a general client's per-request cost on every
routed request.

A fenced re-implementation (issue #14), a leaf: it imports nothing of the EPP.  Its reference is
aiohttp (llhttp's parser): tests/datalayer/test_http_client.py serves hypothesis-generated
responses (status codes, Content-Length / chunked / read-until-close framing, chunk sizes and
extensions, header spellings, keep-alive and close, 1xx interim responses, oversized bodies,
malformed framing) and checks that both clients get the same body or status, or both fail.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from typing import Final, cast

_MAX_HEADER_BYTES: Final = 64 << 10
_HEADERS_END: Final = b"\r\n\r\n"
_STATUS_RE: Final = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?(?=\r\n|\Z)")
_HEADER_RE: Final = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection)[ \t]*:[ \t]*([^\r\n]*?)[ \t]*(?=\r\n|\Z)",
    re.IGNORECASE,
)
_CRLF: Final = b"\r\n"
_HEX: Final = re.compile(rb"[0-9A-Fa-f]+")

# Response states.
_HEAD: Final = 0
_LENGTH: Final = 1
_CHUNKED: Final = 2
_UNTIL_CLOSE: Final = 3
_DONE: Final = 4


def _hostport(host: str, port: int) -> str:
    """The Host header's value: IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ScrapeError(Exception):
    """The endpoint could not be scraped: connect failure, bad status, malformed or oversized reply."""


class ConnectFailed(ScrapeError, ConnectionError):
    """The endpoint refused or dropped the connection: likely dead, not merely slow (a
    ``ConnectionError``, so the data layer can tell without knowing this client)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, the response parsed as bytes arrive.

    Only what a metrics scrape needs: a status line, ``Content-Length`` / chunked /
    read-until-close framing, ``Connection`` semantics.  1xx interim responses are skipped.
    """

    __slots__ = (
        "_body",
        "_buf",
        "_keep_alive",
        "_loop",
        "_max_body",
        "_need",
        "_state",
        "_status",
        "_transport",
        "_waiter",
        "answered",
        "closed",
    )

    def __init__(self, max_body: int, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._max_body = max_body
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._buf = bytearray()
        self._body = bytearray()
        self._state = _DONE
        self._status = 0
        self._need = 0
        self._keep_alive = False
        self.answered = False  # any response bytes seen for the current request
        self.closed = False

    # asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._state == _DONE:
            self._fail(ScrapeError("unexpected data from server"))  # no request outstanding
            return
        self.answered = True
        try:
            if not self._buf and self._state == _HEAD and self._whole(data):
                return
            self._buf += data
            self._advance()
        except ScrapeError as e:
            self._fail(e)

    def _whole(self, data: bytes) -> bool:
        """Fast path: the whole response (with Content-Length) in one read, parsed without copying it."""
        end = data.find(_HEADERS_END)
        if end < 0:
            return False
        self._head(data[:end])
        if self._state != _LENGTH:  # chunked, read-until-close or 1xx: the general path
            self._buf += data[end + 4 :]
            self._advance()
            return True
        start = end + 4
        if len(data) - start < self._need:
            self._buf += data[start:]
            return True
        if len(data) - start > self._need:
            self._buf += data[start + self._need :]  # stray bytes: the connection will not be reused
        self._complete(data[start : start + self._need])
        return True

    def eof_received(self) -> bool | None:
        if self._state == _UNTIL_CLOSE:
            self._keep_alive = False
            self._finish(len(self._buf))
        elif self._waiter is not None and self._state != _DONE:
            self._fail(ScrapeError("connection closed before the response was complete"))
        return None  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            why = f": {exc}" if exc else ""
            self._waiter.set_exception(ScrapeError(f"connection lost{why}"))
        self._waiter = None

    # client side ---------------------------------------------------------------------
    def request(self, payload: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self._transport is not None
        self._waiter = fut = self._loop.create_future()
        self._state = _HEAD
        self.answered = False
        self._transport.write(payload)
        return fut

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed and self._state == _DONE and not self._buf

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # response parsing ----------------------------------------------------------------
    def _advance(self) -> None:
        buf = self._buf
        while True:
            if self._state == _HEAD:
                end = buf.find(_HEADERS_END)
                if end < 0:
                    if len(buf) > _MAX_HEADER_BYTES:
                        raise ScrapeError("response headers too large")
                    return
                self._head(bytes(buf[:end]))
                del buf[: end + 4]
                continue
            if self._state == _LENGTH:
                if len(buf) >= self._need:
                    self._finish(self._need)
                return
            if self._state == _CHUNKED:
                if self._chunks():
                    continue
                return
            if self._state == _UNTIL_CLOSE and len(buf) > self._max_body:
                raise ScrapeError(f"response body larger than {self._max_body} bytes")
            return

    def _head(self, head: bytes) -> None:
        m = _STATUS_RE.match(head)
        if m is None:
            raise ScrapeError(f"malformed status line {head.split(_CRLF, 1)[0][:60]!r}")
        status = int(m.group(2))
        http10 = m.group(1) == b"0"
        length = -1
        chunked = False
        connection = b""
        # Only three headers matter; one regex pass finds them (names are case-insensitive).
        for name, value in _HEADER_RE.findall(head, m.end()):
            name = name.lower()
            if name == b"content-length":
                if not value.isdigit():  # 1*DIGIT: int() would take "+5", "-1", "1_0", " 5"
                    raise ScrapeError("invalid Content-Length")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            else:
                connection = value.lower()
        if 100 <= status < 200:  # interim response: the real one follows
            self._state = _HEAD
            return
        self._status = status
        self._keep_alive = (connection == b"keep-alive") if http10 else (connection != b"close")
        if chunked:
            self._state = _CHUNKED
            self._body = bytearray()
        elif length >= 0:
            if length > self._max_body:
                raise ScrapeError(f"response body of {length} bytes exceeds the limit of {self._max_body}")
            self._state = _LENGTH
            self._need = length
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False

    def _chunks(self) -> bool:
        """Consume complete chunks; True when the response finished (state changed)."""
        buf = self._buf
        while True:
            eol = buf.find(_CRLF)
            if eol < 0:
                if len(buf) > 1024:
                    raise ScrapeError("malformed chunk header")
                return False
            size_text = bytes(buf[:eol]).split(b";", 1)[0].strip()
            if _HEX.fullmatch(size_text) is None:  # 1*HEXDIG: int(_, 16) would take "0x5", "+5", "1_0"
                raise ScrapeError("malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                # Trailers (usually none) end with an empty line.
                end = buf.find(_HEADERS_END, eol) if buf[eol : eol + 4] != _HEADERS_END else eol
                if end < 0:
                    return False
                del buf[: end + 4]
                body, self._body = self._body, bytearray()
                self._complete(bytes(body))
                return True
            if len(buf) < eol + 2 + size + 2:
                return False
            if len(self._body) + size > self._max_body:
                raise ScrapeError(f"response body larger than {self._max_body} bytes")
            self._body += buf[eol + 2 : eol + 2 + size]
            if buf[eol + 2 + size : eol + 4 + size] != _CRLF:
                raise ScrapeError("malformed chunk terminator")
            del buf[: eol + 4 + size]

    def _finish(self, n: int) -> None:
        body = bytes(self._buf[:n])
        del self._buf[:n]
        self._complete(body)

    def _complete(self, body: bytes) -> None:
        self._state = _DONE
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))

    def _fail(self, err: ScrapeError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)
        self.close()


class ScrapeClient:
    """GET many small documents from many hosts, reusing one connection per host.

    Written for the data layer's hot loop (thousands of scrapes per second): a request is
    one pre-built bytes write and a response is parsed incrementally in ``data_received``,
    with no per-request headers objects, streams or tasks.  Connections are kept alive and
    reused (at most ``max_idle_per_host`` idle per host); an error or a cancellation closes
    the connection it happened on, so a late reply can never be read as the next one.
    Deadlines are the caller's (cancel the awaiting task).
    """

    __slots__ = ("_idle", "_max_body", "_max_idle", "_requests", "_ssl", "_user_agent")

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int = 16 << 20,
        max_idle_per_host: int = 2,
        user_agent: str = "epp",
    ) -> None:
        self._ssl = ssl_context
        self._max_body = max_body_bytes
        self._max_idle = max_idle_per_host
        self._user_agent = user_agent
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._requests: dict[tuple[str, int, str], bytes] = {}

    async def get(self, host: str, port: int, path: str) -> bytes:
        """The body of ``GET path`` on ``host:port``; ``ScrapeError`` unless the status is 200."""
        payload = self._requests.get((host, port, path))
        if payload is None:
            payload = self._request_bytes(host, port, path)
        status, body = await self._exchange((host, port), payload)
        if status != 200:
            raise ScrapeError(f"unexpected status code {status}")
        return body

    async def post(
        self, host: str, port: int, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """``POST path`` with ``body`` on ``host:port``: the status and the response body.  Only for
        idempotent calls: like a GET, it is sent again once on a fresh connection when a reused
        keep-alive connection closes before any reply."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {_hostport(host, port)}\r\nUser-Agent: {self._user_agent}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        return await self._exchange((host, port), head + body)

    async def _exchange(self, key: tuple[str, int], payload: bytes) -> tuple[int, bytes]:
        host, port = key
        conn = self._take_idle(key)
        if conn is not None:
            try:
                status, body = await conn.request(payload)
            except ScrapeError:
                # The server may have closed the idle connection just as we reused it (as
                # Go's transport does for idempotent requests, retry once on a fresh one).
                conn.close()
                if conn.answered:
                    raise
                conn = None
            except BaseException:
                conn.close()  # a reply may still arrive: this connection can never be reused
                raise
        if conn is None:
            conn = await self._connect(host, port)
            try:
                status, body = await conn.request(payload)
            except BaseException:
                conn.close()
                raise
        if conn.reusable:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self._max_idle:
                idle.append(conn)
            else:
                conn.close()
        else:
            conn.close()
        return status, body

    def forget(self, host: str, port: int) -> None:
        """Close idle connections to ``host:port`` (its endpoint went away)."""
        for conn in self._idle.pop((host, port), ()):
            conn.close()
        for k in [k for k in self._requests if k[0] == host and k[1] == port]:
            del self._requests[k]

    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        self._requests.clear()
        await asyncio.sleep(0)  # let transports run their close callbacks

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        max_body = self._max_body
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(max_body, loop), host, port, ssl=self._ssl
            )
        except (OSError, ssl.SSLError) as e:
            raise ConnectFailed(f"connect to {host}:{port} failed: {e}") from None
        return conn

    def _request_bytes(self, host: str, port: int, path: str) -> bytes:
        payload = (
            f"GET {path} HTTP/1.1\r\nHost: {_hostport(host, port)}\r\nUser-Agent: {self._user_agent}\r\n"
            "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\n\r\n"
        ).encode("latin-1")
        self._requests[(host, port, path)] = payload
        return payload


class TLSConfigError(ValueError):
    """A TLS option of a scrape client cannot be used; the message names the parameter."""


def tls_client_context(
    *,
    skip_verify: bool,
    ca_cert_path: str = "",
    client_cert_path: str = "",
    client_key_path: str = "",
) -> ssl.SSLContext:
    """The client side of an https scrape, as llm-d-router's ``tlsClientConfig`` builds it.

    ``skip_verify`` accepts any server certificate; otherwise the server is verified against
    ``ca_cert_path`` (a PEM bundle) or the system pool.  ``client_cert_path`` and
    ``client_key_path`` (set together) present a client certificate, so a target that requires
    mTLS accepts the scraper.  Files are read now, so a bad path fails at startup, naming the
    parameter, instead of on every poll.
    """
    ctx = ssl.create_default_context()
    if skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_cert_path:
        try:
            ctx.load_verify_locations(cafile=ca_cert_path)
        except FileNotFoundError as e:
            raise TLSConfigError(f"caCertPath: reading CA cert {ca_cert_path}: {e.strerror}") from None
        except ssl.SSLError:
            raise TLSConfigError(f"caCertPath: no valid CA certs in {ca_cert_path}") from None
    if client_cert_path or client_key_path:
        if not (client_cert_path and client_key_path):
            missing = "clientKeyPath" if client_cert_path else "clientCertPath"
            raise TLSConfigError(f"{missing}: clientCertPath and clientKeyPath must be set together")
        try:
            ctx.load_cert_chain(client_cert_path, client_key_path)
        except OSError as e:  # ssl.SSLError is an OSError too: a bad PEM or a key that does not match
            raise TLSConfigError(
                f"clientCertPath/clientKeyPath: loading client cert {client_cert_path} "
                f"with key {client_key_path}: {e.strerror or e}"
            ) from None
    return ctx
