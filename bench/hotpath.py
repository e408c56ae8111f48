"""The EPP's own per-request work on its HTTP/2 transport, against the no-op ext_proc server, in one process.

    python -m bench.hotpath [--requests N] [--rounds R] [--profile] [--general]

No sockets and no Envoy: a fake transport feeds one ``Connection`` the bytes Envoy sends for
one request at a time (HEADERS + the gRPC messages of GIE's FULL_DUPLEX_STREAMED exchange: request
headers, a 1 KB chat body, response headers, 3 streamed chunks, END_STREAM) and counts the bytes
written back, so what is measured is exactly what the EPP process adds per request: HPACK,
framing, the session, the director and its plugins (config/default.yaml over 4 endpoints), the
loop's callbacks and tasks.  The same bytes go to the no-op session of ``bench.noop_extproc`` on
the same transport (the ``floor-h2`` path of bench/overhead.py), rounds alternating, and the
report is the ratio of thread CPU per request, EPP over floor: machine noise cancels in it.
The modules mypyc compiled at install (hatch_build.py ``COMPILED_MODULES``) run compiled; with
``EPP_PURE_PYTHON=1`` everything runs from source (``epp.compiled``), which ``--profile`` needs to
see inside them (cProfile sees no frame in compiled code).
The cyclic collector is tuned as ``epp serve`` tunes it once started (``tune_gc``: startup heap
frozen, gen-0 every 20,000 allocations); ``--default-gc`` keeps Python's thresholds (700), which
charge the EPP ~6 µs a request more for gen-0 passes the server does not make as often.
Histogram observations are folded on a daemon thread (epp.metrics.fast), ~50 ns a value, not
counted here (thread CPU of the loop).  ``--general`` adds a third server whose scheduler keeps
the general path for every request (``Scheduler(fused=False)``), in the same rounds: what the
fused plan (epp.scheduling.fused) saves, as a difference measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import pstats
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hpack
import orjson
import uvloop

from bench.noop_extproc import NoopProcessor
from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.admission.shedding import LegacyAdmission
from epp.app.build import build
from epp.app.registry import default_registry
from epp.app.serve import tune_gc
from epp.config.load import load_config
from epp.datastore.store import Datastore, PoolInfo
from epp.director.director import Director
from epp.scheduling.scheduler import Scheduler
from epp.server.extproc import ExtProcServicer
from epp.server.h2.connection import Connection
from epp.server.h2.frames import PREFACE
from epp.server.h2.server import H2GrpcServer
from epp.testing.builders import make_endpoint

DEFAULT_CONFIG = Path(__file__).parents[1] / "config" / "default.yaml"
FULL_DUPLEX = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
GRPC_HEADERS = (
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
    (b":authority", b"epp"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
)


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, sid) + payload


def _grpc(msg: pb.ProcessingRequest) -> bytes:
    data = msg.SerializeToString()
    return b"\x00" + struct.pack(">I", len(data)) + data


def _header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


def chat_body(seed: int) -> bytes:
    """A ~1 KB OpenAI chat request, as bench/overhead.py sends (16 shared system prompts)."""
    system = f"You are assistant number {seed % 16}. " * 12
    return orjson.dumps(
        {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {seed}: " + "tell me about routing " * 20},
            ],
            "max_tokens": 3,
        }
    )


def request_messages(seed: int) -> tuple[bytes, bytes]:
    """Envoy's gRPC messages for one request: (request side, response side), each framed."""
    headers = {
        ":authority": "epp.bench",
        ":path": "/v1/chat/completions",
        ":method": "POST",
        ":scheme": "http",
        "content-type": "application/json",
        "user-agent": "bench/1",
        "x-forwarded-proto": "http",
        "x-request-id": f"3c0e8a52-{seed:08x}-4a8e-9c7e-2f6d0b8e1a77",
    }
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_header_map(headers)),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX
        ),
    )
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=chat_body(seed), end_of_stream=True))
    resp = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=_header_map({":status": "200", "content-type": "text/event-stream", "server": "sim"})
        )
    )
    chunks = [
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'data: {"choices":[{"text":"x"}]}\n\n')),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'data: {"choices":[{"text":"y"}]}\n\n')),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)),
    ]
    return _grpc(first) + _grpc(body), b"".join(_grpc(m) for m in (resp, *chunks))


class FakeTransport:
    """What ``Connection`` writes to: counts bytes and writes, keeps nothing."""

    def __init__(self) -> None:
        self.writes = 0
        self.written = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


class Client:
    """Envoy's side of one connection: streams opened one after another, their frames fed in."""

    def __init__(self, server: H2GrpcServer, requests: list[tuple[bytes, bytes]]) -> None:
        self.conn = Connection(server)
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        initial_window = struct.pack(">HI", 4, 1 << 24)  # SETTINGS_INITIAL_WINDOW_SIZE, as Envoy's
        self.conn.data_received(PREFACE + _frame(4, 0, 0, initial_window))
        self.conn.data_received(_frame(4, 1, 0, b""))  # SETTINGS ACK
        # Literal never-indexed fields: every block is the same bytes, the client's cost per request nil.
        self._block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in GRPC_HEADERS])
        self._requests = itertools.cycle(requests)
        self._sid = 1

    def _headers(self, sid: int) -> bytes:
        return _frame(1, 4, sid, self._block)  # HEADERS, END_HEADERS

    async def one(self) -> None:
        """One request: its request side, routing (which may hand over to a task), its response."""
        sid = self._sid
        self._sid += 2
        req, resp = next(self._requests)
        conn = self.conn
        conn.data_received(self._headers(sid) + _frame(0, 0, sid, req))
        streams: dict[int, Any] = conn._streams  # the bench watches the stream's reply and end
        stream = streams.get(sid)
        await _until(lambda: stream is None or stream.headers_sent)  # routed: the reply's HEADERS went out
        conn.data_received(_frame(0, 1, sid, resp))  # END_STREAM
        if conn.send_window < 1 << 20:  # Envoy's connection-level WINDOW_UPDATE
            conn.data_received(_frame(8, 0, 0, struct.pack(">I", (1 << 24) - conn.send_window)))
        await _until(lambda: sid not in streams)
        await asyncio.sleep(0)  # the flush of the last writes


async def _until(done: Callable[[], bool], iterations: int = 1000) -> None:
    """Let the loop run until ``done()``; a request that needs more iterations than that is stuck."""
    for _ in range(iterations):
        if done():
            return
        await asyncio.sleep(0)
    raise RuntimeError("a request did not finish: the transport is stuck")


def epp_server(
    config: str, endpoints: int, *, fused: bool = True, datastore: Datastore | None = None
) -> H2GrpcServer:
    """The EPP's h2 server over ``endpoints`` endpoints with fixed metrics (no scraping);
    ``fused=False``: its scheduler runs the general path for every request; ``datastore``: the
    caller's (to change the endpoints' metrics between requests)."""
    c = build(load_config(config), default_registry())
    scheduler = c.scheduler
    if not fused and isinstance(scheduler, Scheduler):
        scheduler = Scheduler(scheduler.handler, list(scheduler.profiles.values()), fused=False)
    ds = Datastore() if datastore is None else datastore
    ds.pool = PoolInfo(name="bench", target_ports=(8000,), app_protocol="http")
    ds.pool_synced = True
    eps = [make_endpoint(i, queue=i % 3, kv=0.1 * i) for i in range(endpoints)]
    ds.replace_all([e.metadata for e in eps])
    for e in eps:
        live = ds.get(e.name)
        assert live is not None
        live.metrics = e.metrics
    for observer in c.observers:
        ds.add_observer(observer)
    pipeline = c.request_control.pipeline(
        scheduler=scheduler, admission=LegacyAdmission(c.saturation_detector)
    )
    return H2GrpcServer(ExtProcServicer(Director(ds, pipeline)))


async def measure(client: Client, n: int) -> float:
    """Thread CPU µs per request over ``n`` requests."""
    t0 = time.thread_time_ns()
    for _ in range(n):
        await client.one()
    return (time.thread_time_ns() - t0) / n / 1000


async def main(
    requests: int, rounds: int, profile: str, config: str, default_gc: bool = False, general: bool = False
) -> None:
    msgs = [request_messages(i) for i in range(64)]
    epp = Client(epp_server(config, 4), msgs)
    floor = Client(H2GrpcServer(NoopProcessor(["10.0.0.1:8000", "10.0.0.2:8000"])), msgs)
    slow = Client(epp_server(config, 4, fused=False), msgs) if general else None
    if not default_gc:  # as ``epp serve`` once started: the cyclic collector's share is the server's
        tune_gc()
    for c in (epp, floor, slow):
        if c is not None:
            await measure(c, 500)
            c.transport.writes = 0
    ratios, epp_us, floor_us, general_us = [], [], [], []
    for r in range(rounds):
        if slow is not None and r % 2:  # alternate which EPP runs first: no order bias
            general_us.append(await measure(slow, requests))
        e = await measure(epp, requests)
        f = await measure(floor, requests)
        if slow is not None and not r % 2:
            general_us.append(await measure(slow, requests))
        epp_us.append(e)
        floor_us.append(f)
        ratios.append(e / f)
    total = rounds * requests
    print(
        f"epp {statistics.median(epp_us):.1f} us/req  floor {statistics.median(floor_us):.1f} us/req  "
        f"added {statistics.median(epp_us) - statistics.median(floor_us):.1f} us  "
        f"ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f})  "
        f"writes/req epp {epp.transport.writes / total:.2f} floor {floor.transport.writes / total:.2f}"
    )
    if general_us:
        saved = [g - e for g, e in zip(general_us, epp_us, strict=True)]
        print(
            f"general path {statistics.median(general_us):.1f} us/req  "
            f"added {statistics.median(general_us) - statistics.median(floor_us):.1f} us  "
            f"fused plan saves {statistics.median(saved):.1f} us/req (median of rounds)"
        )
    if profile:
        sort = profile
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            await epp.one()
        prof.disable()
        stats = pstats.Stats(prof)
        print(f"calls/req {stats.total_calls / 2000:.0f}")  # type: ignore[attr-defined]
        stats.sort_stats(sort).print_stats(45)


def cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--profile",
        choices=("tottime", "cumtime"),
        help="cProfile 2000 EPP requests after the rounds, sorted so",
    )
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument(
        "--general",
        action="store_true",
        help="also measure the EPP with its scheduler on the general path (no fused plan)",
    )
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="keep Python's GC thresholds (the server freezes its startup heap and raises them)",
    )
    args = ap.parse_args(argv)
    uvloop.run(
        main(args.requests, args.rounds, args.profile, args.config.read_text(), args.default_gc, args.general)
    )


if __name__ == "__main__":
    cli()
