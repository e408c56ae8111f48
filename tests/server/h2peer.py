"""A raw HTTP/2 client for hostile and broken-peer tests: it writes any frame, valid or not.

Its reader thread records every frame the server sends, answers SETTINGS, and tracks the
connection window the server grants, so an attacker can stay inside flow control (or not).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections import Counter
from typing import Final

import hpack

from epp.server.extproc import SERVICE_NAME
from epp.server.h2 import frames as h2

PROCESS: Final = f"/{SERVICE_NAME}/Process"
CHECK: Final = "/grpc.health.v1.Health/Check"
GOAWAY_NAMES: Final = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
}


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, sid) + payload


def request_block(encoder: hpack.Encoder, path: str = PROCESS) -> bytes:
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "epp"),
               ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    return bytes(encoder.encode(headers))


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def settings(**values: int) -> bytes:
    ids = {
        "initial_window": h2.S_INITIAL_WINDOW_SIZE,
        "max_frame": h2.S_MAX_FRAME_SIZE,
        "push": h2.S_ENABLE_PUSH,
    }
    return b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items())


class Peer:
    def __init__(
        self, port: int, peer_settings: bytes = b"", *, preface: bool = True, read: bool = True
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.window = 65_535
        self.stream_windows: dict[int, int] = {}
        self.closed = threading.Event()
        self.handshaken = threading.Event()  # the server's SETTINGS read and acknowledged
        self._cv = threading.Condition()
        self._send_lock = threading.Lock()
        self._ack_settings = preface  # before a preface an ACK would break it
        if preface:
            self.send(h2.PREFACE + frame(h2.SETTINGS, 0, 0, peer_settings))
        if read:
            threading.Thread(target=self._reader, daemon=True).start()
            if preface:  # so that our ACK never lands inside a header block the test writes
                self.handshaken.wait(5)

    # -- out -------------------------------------------------------------------------------------
    def send(self, data: bytes, timeout: float = 10.0) -> bool:
        """Write ``data``; False if the server stopped taking it (closed, or not reading) in ``timeout``."""
        try:
            with self._send_lock:
                self.sock.settimeout(timeout)
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def headers(self, sid: int, path: str = PROCESS, flags: int = h2.END_HEADERS) -> bytes:
        return frame(h2.HEADERS, flags, sid, request_block(self.encoder, path))

    def data_in_window(self, sid: int, payload: bytes, flags: int = 0, timeout: float = 10.0) -> bool:
        """DATA that respects the connection window the server granted (waits for credit)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self.window < len(payload):
                left = deadline - time.monotonic()
                if left <= 0 or self.closed.is_set():
                    return False
                self._cv.wait(left)
            self.window -= len(payload)
        return self.send(frame(h2.DATA, flags, sid, payload), timeout)

    # -- in --------------------------------------------------------------------------------------
    def _reader(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    kind, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload, buf = buf[9 : 9 + n], buf[9 + n :]
                    with self._cv:
                        self.frames.append((kind, flags, sid, payload))
                        if kind == h2.WINDOW_UPDATE and sid == 0:
                            self.window += int.from_bytes(payload, "big")
                        self._cv.notify_all()
                    if kind == h2.SETTINGS and not flags & h2.ACK and self._ack_settings:
                        self.send(frame(h2.SETTINGS, h2.ACK, 0))
                        self.handshaken.set()
        except OSError:
            pass
        finally:
            self.closed.set()
            with self._cv:
                self._cv.notify_all()

    def wait_closed(self, timeout: float = 10.0) -> bool:
        return self.closed.wait(timeout)

    def wait_for(self, kind: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not any(f[0] == kind for f in self.frames):
                left = deadline - time.monotonic()
                if left <= 0 or self.closed.is_set():
                    return any(f[0] == kind for f in self.frames)
                self._cv.wait(left)
            return True

    def goaway(self) -> int | None:
        codes = [int.from_bytes(p[4:8], "big") for k, _, _, p in self.frames if k == h2.GOAWAY]
        return codes[-1] if codes else None

    def resets(self) -> Counter[int]:
        return Counter(int.from_bytes(p, "big") for k, _, _, p in self.frames if k == h2.RST_STREAM)

    def grpc_statuses(self) -> Counter[str]:
        dec = hpack.Decoder()
        out: Counter[str] = Counter()
        for k, _, _, p in self.frames:
            if k == h2.HEADERS:
                fields = {_text(k): _text(v) for k, v in dec.decode(p)}
                if "grpc-status" in fields:
                    out[fields["grpc-status"]] += 1
        return out

    def outcome(self) -> str:
        parts = []
        code = self.goaway()
        if code is not None:
            parts.append(f"GOAWAY {GOAWAY_NAMES.get(code, hex(code))}")
        parts += [f"RST {GOAWAY_NAMES.get(c, hex(c))} x{n}" for c, n in sorted(self.resets().items())]
        parts += [f"grpc-status {s} x{n}" for s, n in sorted(self.grpc_statuses().items())]
        return "; ".join(parts) or ("closed" if self.closed.is_set() else "open")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def random_payload(n: int) -> bytes:
    return os.urandom(n)


def _text(x: str | bytes) -> str:
    """hpack gives str or bytes depending on its configuration; compare as text."""
    return x.decode() if isinstance(x, bytes) else x
