"""What one sync message costs this machine's kernel, whatever the EPP's code does (issue 30).

    python -m bench.tcp_wakes [--quick]

Two processes on loopback TCP (``TCP_NODELAY``), a ``SIZE``-byte message every ``EVERY``
seconds (a busy replica's batches: bench/scaleout's busy cell receives ~1 a millisecond at 4
replicas), in two modes:

* ``woken``: the receiver sleeps in ``epoll_wait`` and every message wakes it — what a peer's
  batch cost the EPP before its Publish connections were read quietly.
* ``quiet``: the receiver's socket has ``SO_RCVLOWAT`` raised (``epoll`` never reports it
  readable, and the kernel does not wake the receiver), and the receiver, kept awake by work of
  its own, reads the socket every ``EVERY`` seconds — what a replica that routes pays for a
  batch read in a wake it had anyway (``epp.server.quiet_reads``).

Measured: the sender's thread CPU per ``send`` (on a VM, waking another process's vCPU is
costly: the woken mode's write pays it), and the receiver's CPU per message (woken: its whole
process time; quiet: the thread time of its reads only, the work that keeps it awake not
counted).  ``bound`` turns the pair into what a replica pays per request it routes at N replicas
when each peer sends it one batch per ``REQUESTS_PER_BATCH`` requests (the busy cell: a 3 ms gap
at 1,000 req/s) and it sends each peer as many: the transport's floor under the sync's cost,
before any Python runs.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import time
from typing import Any, Final

from bench.common import log, rnd, write_result

SIZE: Final = 200  # bytes: a busy replica's batch (bench/scaleout: 100-300 bytes a batch)
EVERY: Final = 0.001
QUIET_LOWAT: Final = 64 * 1024
REQUESTS_PER_BATCH: Final = 3.0  # bench/scaleout's busy cell: 1,000 req/s, a batch per 3 ms gap
CAPACITY_PER_BATCH: Final = 10.0  # its part capacity: 3,000 req/s (a batch per 10 requests measured)


def _receiver(listener: socket.socket, n: int, quiet: bool, out: int) -> None:
    conn, _ = listener.accept()
    conn.setblocking(False)
    got = 0
    if quiet:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, QUIET_LOWAT)
        spent = 0.0
        due = time.perf_counter()
        while got < n * SIZE:
            while time.perf_counter() < due:  # the receiver's own work: it is awake anyway
                pass
            due += EVERY
            t0 = time.thread_time()
            try:  # noqa: SIM105 - suppress() would add its own cost to the timed read
                got += len(conn.recv(1 << 20))
            except BlockingIOError:
                pass
            spent += time.thread_time() - t0
    else:
        poller = select.epoll()
        poller.register(conn.fileno(), select.EPOLLIN)
        t0 = time.process_time()
        while got < n * SIZE:
            poller.poll()
            try:  # noqa: SIM105 - as above
                got += len(conn.recv(1 << 20))
            except BlockingIOError:
                pass
        spent = time.process_time() - t0
    os.write(out, f"{spent}\n".encode())


def one(n: int, quiet: bool) -> dict[str, Any]:
    """``n`` messages in one mode: the sender's and the receiver's CPU per message, in µs."""
    listener = socket.create_server(("127.0.0.1", 0))
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _receiver(listener, n, quiet, wr)
        finally:
            os._exit(0)
    os.close(wr)
    sender = socket.create_connection(listener.getsockname())
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.close()
    message = b"x" * SIZE
    time.sleep(0.1)  # the receiver is in its loop
    spent = 0.0
    due = time.perf_counter()
    for _ in range(n):
        while time.perf_counter() < due:
            pass
        due += EVERY
        t0 = time.thread_time()
        sender.send(message)
        spent += time.thread_time() - t0
    with os.fdopen(rd) as f:
        received = float(f.readline())
    os.waitpid(pid, 0)
    sender.close()
    return {"send_us": rnd(spent / n * 1e6, 2), "receive_us": rnd(received / n * 1e6, 2)}


def bound(send_us: float, receive_us: float, replicas: int, per_batch: float = REQUESTS_PER_BATCH) -> float:
    """µs a request: N - 1 peers each send one batch per ``per_batch`` requests, and this
    replica writes each of them one as often."""
    return (replicas - 1) * (send_us + receive_us) / per_batch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tcp_wakes", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 messages a mode, 3 rounds (else 10,000, 5)")
    args = ap.parse_args(argv)
    n, rounds = (2_000, 3) if args.quick else (10_000, 5)
    runs: dict[str, list[dict[str, Any]]] = {"woken": [], "quiet": []}
    for r in range(rounds):
        for mode in ("woken", "quiet") if r % 2 == 0 else ("quiet", "woken"):
            runs[mode].append(one(n, mode == "quiet"))
            log(f"tcp_wakes round {r + 1}/{rounds} {mode}: {runs[mode][-1]}")
    doc: dict[str, Any] = {"size_bytes": SIZE, "every_s": EVERY, "messages": n, "rounds": rounds}
    for mode, cells in runs.items():
        send = sorted(c["send_us"] for c in cells)[len(cells) // 2]
        receive = sorted(c["receive_us"] for c in cells)[len(cells) // 2]
        doc[mode] = {
            "send_us": send,
            "receive_us": receive,
            "rounds": cells,
            "bound_us_per_request": {str(k): rnd(bound(send, receive, k), 1) for k in (2, 4, 8)},
            # at bench/scaleout's part capacity (3,000 req/s): a batch per 10 requests
            "bound_us_per_request_at_capacity": {
                str(k): rnd(bound(send, receive, k, CAPACITY_PER_BATCH), 1) for k in (2, 4, 8)
            },
        }
    path = write_result("tcp_wakes", doc, mode="quick" if args.quick else "full", seeds={})
    log(
        f"tcp_wakes: woken {doc['woken']['send_us']} / {doc['woken']['receive_us']} µs, "
        f"quiet {doc['quiet']['send_us']} / {doc['quiet']['receive_us']} µs (send / receive); {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
