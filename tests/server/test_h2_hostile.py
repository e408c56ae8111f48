"""Hostile and broken HTTP/2 peers against the real ``epp`` process (issue #19).

Each attack runs against one EPP subprocess (``--endpoints``, health on the ext_proc port);
after each: the server answers gRPC health, serves a normal ext_proc call within 2 s, and its
RSS grew less than 100 MiB over the whole module.  ``H2_ATTACK_REPORT=path`` writes the
figures (RSS growth, time to serve after the attack, outcome) as JSON lines.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.server.h2 import frames as h2
from epp_sim.demo.procs import EppProcess
from tests.server.h2peer import CHECK, PROCESS, Peer, frame, grpc_message, rss_bytes, settings
from tests.server.harness import req_body, req_headers

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a normal call within 2 s after each attack
MIB = 1 << 20


@dataclass
class Epp:
    port: int
    pid: int
    baseline_rss: int


@pytest.fixture(scope="module")
def epp() -> Iterator[Epp]:
    proc_def = EppProcess(
        "--endpoints=127.0.0.1:9",  # discard: nothing listens, scheduling still picks it
        "--bind-address=127.0.0.1",
        "--health-checking",
        "--grpc-keepalive-time=0",
        "--shutdown-delay=0s",
        "--shutdown-grace-period=1s",
        "--v=0",
    )
    with open(os.devnull, "wb") as sink:
        proc = subprocess.Popen(proc_def.argv(), stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                serve_normally(proc_def.grpc_port)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        for _ in range(20):  # warm up: what a first few calls allocate is not an attack's doing
            serve_normally(proc_def.grpc_port)
        yield Epp(proc_def.grpc_port, proc.pid, rss_bytes(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc_def.cleanup()


def serve_normally(port: int) -> float:
    """gRPC health, then one ext_proc call; the seconds both took."""
    started = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        headers = {":method": "GET", ":path": "/v1/models", ":authority": "x", "x-request-id": "after-attack"}
        replies = list(
            pb_grpc.ExternalProcessorStub(ch).Process(iter([req_headers(headers, eos=True)]), timeout=2)
        )
        assert replies
    return time.monotonic() - started


# -- the attacks: each returns its peer (the outcome is read from what the server sent) ----------
def rapid_reset(port: int) -> Peer:
    """CVE-2023-44487: open a stream and reset it at once, thousands of times."""
    p = Peer(port)
    batch = bytearray()
    for i in range(5000):
        sid = 2 * i + 1
        batch += p.headers(sid) + frame(h2.RST_STREAM, 0, sid, struct.pack(">I", h2.CANCEL))
        if len(batch) > 64 << 10:
            if not p.send(bytes(batch), 5):
                break
            batch.clear()
    p.send(bytes(batch), 5)
    p.wait_closed()
    return p


def continuation_flood(port: int) -> Peer:
    """CVE-2024-27316 family: a header block that never ends."""
    p = Peer(port)
    p.send(frame(h2.HEADERS, 0, 1, b"\x82"))
    for _ in range(10_000):
        if not p.send(frame(h2.CONTINUATION, 0, 1, b"\x82"), 5):
            break
    p.wait_closed()
    return p


def continuation_big(port: int) -> Peer:
    """A header block of 16 KB CONTINUATION frames growing without end."""
    p = Peer(port)
    p.send(frame(h2.HEADERS, 0, 1, b"\x82"))
    for _ in range(200):
        if not p.send(frame(h2.CONTINUATION, 0, 1, b"\x82" * 16_000), 5):
            break
    p.wait_closed()
    return p


def ping_flood_unread(port: int) -> Peer:
    """PINGs by the hundred thousand, never reading the ACKs."""
    p = Peer(port, read=False)
    burst = frame(h2.PING, 0, 0, b"12345678") * 10_000
    for _ in range(30):
        if not p.send(burst, 3):
            break
    return _then_read(p)


def settings_flood(port: int) -> Peer:
    """SETTINGS frames by the hundred thousand, never reading the ACKs."""
    p = Peer(port, read=False)
    burst = frame(h2.SETTINGS, 0, 0, settings(initial_window=65_535)) * 10_000
    for _ in range(30):
        if not p.send(burst, 3):
            break
    return _then_read(p)


def empty_data_flood(port: int) -> Peer:
    """Empty DATA frames on an open stream (each costs the server a frame, moves nothing)."""
    p = Peer(port)
    p.send(p.headers(1))
    p.send(frame(h2.DATA, 0, 1) * 100_000, 5)
    p.wait_closed()
    return p


def too_many_streams(port: int) -> Peer:
    """1,500 streams opened and left open: past SETTINGS_MAX_CONCURRENT_STREAMS they are refused."""
    p = Peer(port)
    p.send(b"".join(p.headers(2 * i + 1) for i in range(1500)))
    p.wait_for(h2.RST_STREAM, 5)
    time.sleep(0.5)
    p.close()
    return p


def huge_length_prefix(port: int) -> Peer:
    """A gRPC message announcing 4 GB: refused at once, never buffered."""
    p = Peer(port)
    p.send(p.headers(1) + frame(h2.DATA, 0, 1, b"\x00\xff\xff\xff\xff" + b"x" * 1000))
    p.wait_for(h2.RST_STREAM, 5)
    p.close()
    return p


def partial_messages(port: int) -> Peer:
    """Many streams each sending most of a 19 MiB message, never finishing it: the connection's
    buffer bound stops it."""
    p = Peer(port)
    chunk = b"y" * 16_000
    p.send(b"".join(p.headers(2 * i + 1) for i in range(12)))
    for i in range(12):
        sid = 2 * i + 1
        if not p.data_in_window(sid, grpc_message(b"")[:1] + struct.pack(">I", 19 * MIB) + chunk, timeout=5):
            break
    sent = 0
    while sent < 12 * 15 * MIB and not p.closed.is_set():
        sid = 2 * ((sent // len(chunk)) % 12) + 1
        if not p.data_in_window(sid, chunk, timeout=5):
            break
        sent += len(chunk)
    p.wait_closed()
    return p


def zero_window_reader(port: int) -> Peer:
    """Grants the server no stream window (SETTINGS_INITIAL_WINDOW_SIZE 0), then sends ext_proc
    messages whose replies can never leave, on 500 streams, for as long as credit comes."""
    p = Peer(port, settings(initial_window=0))
    body = req_headers({":method": "GET", ":path": "/", "x-request-id": "z"}, eos=False).SerializeToString()
    msg = grpc_message(body)
    p.send(b"".join(p.headers(2 * i + 1) for i in range(500)))
    deadline = time.monotonic() + 5
    i = 0
    while time.monotonic() < deadline and not p.closed.is_set():
        if not p.data_in_window(2 * (i % 500) + 1, msg * 50, timeout=1):
            break
        i += 1
    time.sleep(0.5)
    p.close()
    return p


def never_reads(port: int) -> Peer:
    """Opens huge windows, then sends health checks as fast as it can and reads nothing: the
    replies pile up in the server's output until it stops reading."""
    p = Peer(port, settings(initial_window=0x7FFFFFFF), read=False)
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF - 65_535)))
    check = grpc_message(health_pb2.HealthCheckRequest(service="").SerializeToString())
    sid = 1
    for _ in range(200):
        batch = b"".join(
            p.headers(sid + 2 * j, CHECK) + frame(h2.DATA, h2.END_STREAM, sid + 2 * j, check)
            for j in range(500)
        )
        sid += 1000
        if not p.send(batch, 2):
            break
    time.sleep(0.5)
    p.close()
    return p


def window_overflow(port: int) -> Peer:
    """A WINDOW_UPDATE taking the connection window past 2^31-1."""
    p = Peer(port)
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)))
    p.wait_closed()
    return p


def flow_control_ignored(port: int) -> Peer:
    """A 25 MiB request body streamed as 60 KB ext_proc messages while the server's own window
    is 0 (its replies cannot leave), ignoring the stream's credit."""
    p = Peer(port, settings(initial_window=0))
    first = req_headers({":method": "POST", ":path": "/", "x-request-id": "f"}, eos=False).SerializeToString()
    body = grpc_message(req_body(b"b" * 60_000, eos=False).SerializeToString())
    p.send(p.headers(1) + frame(h2.DATA, 0, 1, grpc_message(first)))
    for _ in range(25 * MIB // len(body)):
        if not p.send(
            frame(h2.DATA, 0, 1, body[:16_000])
            + frame(h2.DATA, 0, 1, body[16_000:32_000])
            + frame(h2.DATA, 0, 1, body[32_000:48_000])
            + frame(h2.DATA, 0, 1, body[48_000:]),
            2,
        ):
            break
        if p.resets():
            break
    p.wait_for(h2.RST_STREAM, 5)
    p.close()
    return p


def hpack_bomb(port: int) -> Peer:
    """A 4 KB header stored once in the HPACK table, then referenced 16,000 times (64 MB decoded)."""
    p = Peer(port)
    big = bytes(p.encoder.encode([("x-bomb", "b" * 4000)]))  # literal with incremental indexing: index 62
    block = request_block_prefix(p) + big
    p.send(frame(h2.HEADERS, h2.END_HEADERS, 1, block))
    bomb = b"\xbe" * 16_000  # indexed field 62, 16,000 times
    p.send(frame(h2.HEADERS, h2.END_HEADERS, 3, bomb))
    p.wait_closed()
    return p


def request_block_prefix(p: Peer) -> bytes:
    return bytes(
        p.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", PROCESS),
                (":authority", "epp"),
                ("content-type", "application/grpc"),
            ]
        )
    )


def garbage(port: int) -> Peer:
    """Random bytes after the preface."""
    p = Peer(port)
    p.send(os.urandom(64 << 10), 5)
    p.wait_closed()
    return p


def slowloris(port: int) -> Peer:
    """200 connections that stop halfway through the preface (the handshake timeout closes them)."""
    peers = [Peer(port, preface=False, read=False) for _ in range(200)]
    for q in peers:
        q.send(h2.PREFACE[:10])
    time.sleep(0.5)
    for q in peers[1:]:
        q.close()
    peers[0].close()
    return peers[0]


def _then_read(p: Peer) -> Peer:
    import threading

    threading.Thread(target=p._reader, daemon=True).start()
    p.wait_closed(10)
    return p


ATTACKS: dict[str, tuple[Callable[[int], Peer], str | None]] = {
    "rapid reset (CVE-2023-44487)": (rapid_reset, "GOAWAY ENHANCE_YOUR_CALM"),
    "CONTINUATION flood": (continuation_flood, "GOAWAY ENHANCE_YOUR_CALM"),
    "CONTINUATION 16 KB frames": (continuation_big, "GOAWAY ENHANCE_YOUR_CALM"),
    "PING flood, ACKs unread": (ping_flood_unread, "GOAWAY ENHANCE_YOUR_CALM"),
    "SETTINGS flood, ACKs unread": (settings_flood, "GOAWAY ENHANCE_YOUR_CALM"),
    "empty DATA flood": (empty_data_flood, "GOAWAY ENHANCE_YOUR_CALM"),
    "1,500 concurrent streams": (too_many_streams, "RST REFUSED_STREAM x500"),
    "4 GB length prefix": (huge_length_prefix, "grpc-status 8"),
    "unfinished 19 MiB messages on 12 streams": (partial_messages, "GOAWAY ENHANCE_YOUR_CALM"),
    "zero-window reader, 500 streams": (zero_window_reader, None),
    "never reads, huge windows": (never_reads, None),
    "WINDOW_UPDATE past 2^31-1": (window_overflow, "GOAWAY FLOW_CONTROL_ERROR"),
    "25 MiB body, server's window 0": (flow_control_ignored, None),
    "HPACK bomb": (hpack_bomb, "GOAWAY COMPRESSION_ERROR"),
    "random bytes": (garbage, None),
    "200 half-preface connections": (slowloris, None),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_leaves_the_server_serving(epp: Epp, name: str) -> None:
    attack, expected = ATTACKS[name]
    started = time.monotonic()
    peer = attack(epp.port)
    attack_s = time.monotonic() - started
    outcome = peer.outcome()
    peer.close()
    served_s = serve_normally(epp.port)
    growth = rss_bytes(epp.pid) - epp.baseline_rss
    row = {"attack": name, "outcome": outcome, "rss_growth_mib": round(growth / MIB, 1),
           "serve_after_s": round(served_s, 3), "attack_s": round(attack_s, 2)}  # fmt: skip
    print(json.dumps(row))
    report = os.environ.get("H2_ATTACK_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(row) + "\n")
    if expected is not None:
        assert expected in outcome
    assert served_s < 2.0
    assert growth < 100 * MIB
