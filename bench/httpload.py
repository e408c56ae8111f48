"""A small, fast HTTP/1.1 load generator: open loop at a fixed rate, or closed loop for capacity.

Raw asyncio protocol with keep-alive connections (aiohttp costs more per request than the
paths it would measure).  Open loop: arrival times are drawn up front from a seeded Poisson
process and a request is never held back by a slow answer; its latency counts from its
*scheduled* time, so queueing anywhere (including a connection wait in this client) is charged
to the path, not hidden (no coordinated omission).  ``late_ms`` records how far behind schedule
the client itself sent, to tell client lag from path latency.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, cast

_DATA: Final = b"data: "


@dataclass(slots=True)
class Response:
    status: int = 0
    first_byte: float = 0.0  # perf_counter of the first body byte
    done: float = 0.0
    body_bytes: int = 0
    events: int = 0  # SSE "data: " lines seen in the body
    served_by: str = ""  # the simulator's x-inference-port header: which replica answered


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._fut: asyncio.Future[Response] | None = None
        self._resp = Response()
        self._state = 0  # 0 head, 1 fixed-length body, 2 chunk size line, 3 chunk data, 4 final CRLF
        self._left = 0
        self._tail = b""
        self._keep = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._fut is not None and not self._fut.done():
            if self._state == 1 and self._left < 0:  # read-to-close body
                self._finish()
            else:
                self._fut.set_exception(ConnectionError("connection closed mid-response"))

    def request(self, data: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._fut = asyncio.get_running_loop().create_future()
        self._resp = Response()
        self._state = 0
        self._tail = b""
        self.transport.write(data)
        return self._fut

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._advance()

    def _body(self, chunk: bytes | bytearray) -> None:
        r = self._resp
        if not r.first_byte:
            r.first_byte = time.perf_counter()
        r.body_bytes += len(chunk)
        joined = self._tail + bytes(chunk)
        r.events += joined.count(_DATA) - self._tail.count(_DATA)
        self._tail = joined[-5:]

    def _finish(self) -> None:
        self._resp.done = time.perf_counter()
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_result(self._resp)
        if not self._keep and self.transport is not None:
            self.transport.close()

    def _advance(self) -> None:
        buf = self._buf
        while self._fut is not None:
            if self._state == 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).decode("latin-1").split("\r\n")
                del buf[: end + 4]
                self._resp.status = int(head[0].split(" ", 2)[1])
                length, chunked, self._keep = -1, False, True
                for line in head[1:]:
                    k, _, v = line.partition(":")
                    k = k.strip().lower()
                    if k == "content-length":
                        length = int(v)
                    elif k == "transfer-encoding" and "chunked" in v.lower():
                        chunked = True
                    elif k == "connection" and "close" in v.lower():
                        self._keep = False
                    elif k == "x-inference-port":
                        self._resp.served_by = v.strip()
                if chunked:
                    self._state = 2
                elif length >= 0:
                    self._state, self._left = 1, length
                    if length == 0:
                        self._finish()
                        self._state = 0
                else:
                    self._state, self._left, self._keep = 1, -1, False
            elif self._state == 1:
                if self._left < 0:  # until close
                    if buf:
                        self._body(buf)
                        buf.clear()
                    return
                take = min(self._left, len(buf))
                if take:
                    self._body(buf[:take])
                    del buf[:take]
                    self._left -= take
                if self._left:
                    return
                self._state = 0
                self._finish()
            elif self._state == 2:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
                del buf[: eol + 2]
                if size == 0:
                    self._state = 4
                else:
                    self._state, self._left = 3, size
            elif self._state == 3:
                take = min(self._left, len(buf))
                if take:
                    self._body(buf[:take])
                    del buf[:take]
                    self._left -= take
                if self._left:
                    return
                self._state, self._left = 4, -2  # CRLF after the chunk data
            else:  # 4: CRLF after chunk data (left == -2) or final CRLF (left >= 0)
                if len(buf) < 2:
                    return
                del buf[:2]
                if self._left == -2:
                    self._state, self._left = 2, 0
                else:
                    self._state = 0
                    self._finish()


class Pool:
    """Keep-alive connections to one host:port, opened on demand up to ``limit``."""

    def __init__(self, host: str, port: int, limit: int = 512) -> None:
        self.host, self.port, self.limit = host, port, limit
        self._idle: list[_Conn] = []
        self._open = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def _get(self) -> _Conn:
        while True:
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    return c
                self._open -= 1
            if self._open < self.limit:
                self._open += 1
                try:
                    _, proto = await asyncio.get_running_loop().create_connection(_Conn, self.host, self.port)
                except OSError:
                    self._open -= 1
                    raise
                return proto
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    def _put(self, c: _Conn) -> None:
        if c.closed:
            self._open -= 1
        else:
            self._idle.append(c)
        if self._waiters:
            w = self._waiters.pop(0)
            if not w.done():
                w.set_result(None)

    async def send(self, data: bytes, timeout: float = 60.0) -> Response:
        c = await self._get()
        try:
            return await asyncio.wait_for(c.request(data), timeout)
        except BaseException:
            if c.transport is not None:
                c.transport.close()
            c.closed = True
            raise
        finally:
            self._put(c)

    def close(self) -> None:
        for c in self._idle:
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()


def post(path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    """A serialized HTTP/1.1 POST of a JSON body."""
    return (
        b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (path.encode(), host.encode(), len(body), body)
    )


@dataclass(slots=True)
class Sample:
    latency: float  # seconds from the scheduled time to the end of the response
    ttfb: float  # seconds from the scheduled time to the first body byte
    late: float  # seconds the send started after its scheduled time
    ok: bool
    events: int = 0


@dataclass(slots=True)
class RunResult:
    offered: int
    wall: float
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def achieved_rate(self) -> float:
        return len(self.ok) / self.wall if self.wall > 0 else 0.0


async def _timed(pool: Pool, data: bytes, scheduled: float, out: RunResult, timeout: float) -> None:
    sent = time.perf_counter()
    try:
        r = await pool.send(data, timeout)
    except (OSError, TimeoutError, ConnectionError, ValueError):
        out.errors += 1
        out.samples.append(Sample(time.perf_counter() - scheduled, 0.0, sent - scheduled, False))
        return
    ok = 200 <= r.status < 300
    ttfb = (r.first_byte or r.done) - scheduled
    out.samples.append(Sample(r.done - scheduled, ttfb, sent - scheduled, ok, r.events))
    if not ok:
        out.errors += 1


async def open_loop(
    pool: Pool,
    requests: Sequence[bytes],
    *,
    rate: float,
    duration: float,
    seed: int,
    timeout: float = 30.0,
) -> RunResult:
    """Poisson arrivals at ``rate``/s for ``duration`` s, cycling through ``requests``."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        arrivals.append(t)
    out = RunResult(offered=len(arrivals), wall=0.0)
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    n = len(requests)
    for i, at in enumerate(arrivals):
        scheduled = start + at
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_timed(pool, requests[i % n], scheduled, out, timeout)))
    if tasks:
        await asyncio.gather(*tasks)
    out.wall = max(duration, time.perf_counter() - start)
    return out


async def closed_loop(
    pool: Pool, requests: Sequence[bytes], *, concurrency: int, duration: float, timeout: float = 30.0
) -> RunResult:
    """``concurrency`` workers, each sending its next request as soon as the previous one ends."""
    out = RunResult(offered=0, wall=0.0)
    stop_at = time.perf_counter() + duration
    n = len(requests)

    async def worker(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            out.offered += 1
            await _timed(pool, requests[i % n], time.perf_counter(), out, timeout)
            i += concurrency

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    out.wall = time.perf_counter() - start
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarize(run: RunResult) -> dict[str, float | int | None]:
    """Latency percentiles (ms) of the successful samples, rates, errors and client lag."""
    ok = run.ok
    lat = [s.latency * 1000 for s in ok]
    late = [s.late * 1000 for s in run.samples]

    def r(x: float) -> float | None:
        return None if x != x else round(x, 3)

    return {
        "offered": run.offered,
        "ok": len(ok),
        "errors": run.errors,
        "wall_s": round(run.wall, 3),
        "achieved_rps": round(run.achieved_rate, 1),
        "p50_ms": r(percentile(lat, 50)),
        "p90_ms": r(percentile(lat, 90)),
        "p99_ms": r(percentile(lat, 99)),
        "mean_ms": r(sum(lat) / len(lat)) if lat else None,
        "client_late_p99_ms": r(percentile(late, 99)),
    }
