"""What the sync's content costs, with no transport at all (issue 30's cost goal).

    python -m bench.sync_content [--quick]

In one process, three apps built from prefix-heavy.yaml (bench/scaleout's config) over the same
four endpoints: ``plain`` routes with no sync; ``sender`` routes the same requests with a
``SyncHub`` whose transport only keeps the frames (its plugins record every change, and the hub
drains and encodes them into one batch every ``per_batch`` requests: 3, as a busy replica's 3 ms
gap does at 1,000 req/s, and 10, as it does at 3,000, bench/scaleout's part capacity); ``receiver``
applies those batches (decode and every plugin's apply), then
routes requests of its own over what it learned.  Requests are bench/scaleout's prompts and
responses, through the real director (parse, prefix match, scheduling, pre-request, release).

Reported, per request, medians of the rounds: the sender's cost of the sync (its routing with the
hub less ``plain``'s), the receiver's cost of applying one peer request, and what a peer's state
adds to the receiver's own routing.  ``floor`` adds them up for a replica with N - 1 peers, each
routing as many requests as it does: what the sync costs before a byte moves between processes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any, Final

from bench.common import CONFIGS, log, rnd, write_result
from bench.scaleout_peers import RESPONSE, build_peer, peer_prompts, request
from epp.app.compose import App
from epp.sync.api import Frames
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer

ENDPOINTS: Final = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4"  # never dialled: no data layer runs
# requests a batch carries in bench/scaleout's busy and capacity parts (0.33 and 0.1 batches a request)
PER_BATCH: Final = (3, 10)
MODEL: Final = "m"


class Keep:
    """A ``Transport`` that keeps what the hub sends and moves nothing."""

    port = 0
    max_message_bytes = 16 << 20
    reads_woken = reads_timer = reads_riding = reads_routing = timer_wakes = messages_read = 0
    wants_rides = False
    has_peers = True
    peers: tuple[Peer, ...] = ()

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def bind(self) -> int:
        return 0

    def close(self, linger: float = 0.0) -> None:
        pass

    def set_peers(self, peers: Any) -> None:
        pass

    def send(self, frame: bytes) -> bool:
        self.frames.append(frame)
        return True

    def listen(self, handler: Any, gap: float = 0.0) -> None:
        pass

    def prompt(self) -> None:
        pass

    def read_now(self) -> None:
        pass

    def ride(self) -> None:
        pass

    async def redial(self) -> None:
        pass

    async def serve_snapshots(self, answer: Any) -> None:
        pass

    async def request_snapshot(self, peers: Any, request: bytes, accept: Any, *, deadline: float) -> bool:
        return False


async def _app() -> App:
    app = build_peer(str(CONFIGS / "prefix-heavy.yaml"), ENDPOINTS)
    for plugin in app.components.lifecycle:
        await plugin.start()
    for observer in app.components.observers:
        app.datastore.add_observer(observer)
    return app


def _hub(name: str, app: App) -> tuple[SyncHub, Keep]:
    keep = Keep()
    hub = SyncHub(name, keep)
    hub.bind(app.components.plugins.values())  # not started: the bench calls flush itself
    return hub, keep


async def route(app: App, n: int, seed: int, hub: SyncHub | None, per_batch: int = 1) -> float:
    """Thread CPU of ``n`` requests through ``app``'s director (a flush every ``per_batch``)."""
    reqs = [request(p, MODEL) for p in peer_prompts(256, seed)]
    rng = random.Random(2)
    t0 = time.thread_time()
    for k in range(n):
        headers, body = reqs[rng.randrange(len(reqs))]
        lc = app.director.start(dict(headers), {}, can_hold_response=True)
        await lc.route(body)
        lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
        lc.response_chunk(RESPONSE, True)
        lc.close()
        if hub is not None and (k + 1) % per_batch == 0:
            hub.flush()
    return time.thread_time() - t0


async def run(n: int, rounds: int, per_batch: int) -> dict[str, Any]:
    plain, sender, receiver, alone = await _app(), await _app(), await _app(), await _app()
    hub, keep = _hub("sender", sender)
    peer, _ = _hub("receiver", receiver)
    await route(plain, 500, 9, None)  # warm every path once
    await route(sender, 500, 9, hub, per_batch)
    await route(alone, 500, 9, None)
    keep.frames.clear()
    cells: list[dict[str, Any]] = []
    for r in range(rounds):
        t_plain = await route(plain, n, 1, None)
        t_sender = await route(sender, n, 1, hub, per_batch)
        frames: list[Frames] = [[f] for f in keep.frames]
        keep.frames.clear()
        t0 = time.thread_time()
        for frame in frames:
            peer.on_messages([frame])
        t_apply = time.thread_time() - t0
        t_receiver = await route(receiver, n, 0, None)  # over the peer's state it learned
        t_alone = await route(alone, n, 0, None)  # the same requests, no peer state
        cell = {
            "sender_us": rnd((t_sender - t_plain) / n * 1e6, 2),
            "apply_us_per_peer_request": rnd(t_apply / n * 1e6, 2),
            "routing_over_peer_state_us": rnd((t_receiver - t_alone) / n * 1e6, 2),
            "plain_us": rnd(t_plain / n * 1e6, 2),
            "batches": len(frames),
            "bytes_per_batch": rnd(sum(len(f[0]) for f in frames) / max(1, len(frames)), 1),
        }
        cells.append(cell)
        log(f"sync_content round {r + 1}/{rounds}, {per_batch} a batch: {cell}")
    med = {k: statistics.median(c[k] for c in cells) for k in cells[0] if k != "batches"}
    floor = {
        str(n_): rnd(med["sender_us"] + (n_ - 1) * (med["apply_us_per_peer_request"]), 1) for n_ in (2, 4, 8)
    }
    return {"requests": n, "rounds": cells, "per_batch": per_batch, **med, "floor_us_per_request": floor}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_content", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 requests, 3 rounds (else 6,000, 5)")
    args = ap.parse_args(argv)
    n, rounds = (2_000, 3) if args.quick else (6_000, 5)
    sizes = {str(b): asyncio.run(run(n, rounds, b)) for b in PER_BATCH}
    doc = {"requests": n, "per_batch": sizes}
    path = write_result("sync_content", doc, mode="quick" if args.quick else "full", seeds={"choice": 2})
    for b, size in sizes.items():
        log(
            f"sync_content, {b} requests a batch: sender {size['sender_us']} µs, apply "
            f"{size['apply_us_per_peer_request']} µs a peer request, floor {size['floor_us_per_request']}"
        )
    log(f"sync_content: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
