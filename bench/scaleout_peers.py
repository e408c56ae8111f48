"""A replica's N-1 sync peers replayed by one light process (bench/scaleout, part cost, the
``uncrowded`` cells).

    python -m bench.scaleout_peers --replica PORT --ports P1,P2,... --endpoints H:P,... \\
        --config FILE --rate R --seconds S

Why: the crowded cells run N real EPP processes, their N load clients' work and the simulator
on this machine's 2 cores, so replica 0's CPU per request grows with N whether or not the sync
costs anything (``sync_off_vs_alone``), and the goal's ratio charges that crowding to the sync.
Here replica 0 is the only EPP; its peers are real ``SyncHub``s (the real encoder and ZMQ
transport, one libzmq I/O thread for all of them) bound to the real shared plugins of the
same config (an ``App`` built from the same flags, never served: no ext_proc, no scrapes),
and each peer's routing decisions are made by that app's real director (parse, prefix match,
scheduling, pre-request, release) from the same prompts at the same per-replica rate and on
the same schedule as the crowded cells' load clients, so its batches carry what a real
replica's carry, at the same times.  Each request's response phase follows its routing by
~1 ms, as a load client's second phase follows the EPP's reply, so the release joins the held
batch as it does in a real replica.  What replica 0 receives is therefore a real replica's
traffic; what it costs is read from replica 0 alone.

Protocol with the parent (lines on stdout / stdin): ``ready`` once every hub serves, then the
parent writes ``go`` when its own load starts (the schedules start together, as the crowded
cells' clients do), and the process prints one JSON line (requests made, its CPU) when done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog
import uvloop
import zmq.asyncio

from bench.common import CONFIGS
from epp.app.compose import App, build_app
from epp.cli.flags import parse_flags
from epp.director.director import Director
from epp.server.peering import transport_for
from epp.sync.hub import SyncHub
from epp.sync.peers import Peer, StaticPeers

RESPONSE_AFTER = 0.0005  # the response phase a wake later (uvloop's timers: ~1 ms), as a client's
WARM_START = 0.2  # replica 0 may not be up yet: start cold rather than wait


def peer_prompts(n: int, seed: int) -> list[str]:
    """bench/scaleout's prompts (the same text, so the same prefix blocks and hashes)."""
    return [f"system prompt {g % 8} " * 40 + f"question {seed}-{g}" for g in range(n)]


def request(prompt: str, model: str) -> tuple[dict[str, str], bytes]:
    """What the ext_proc edge hands the director for bench/extproc_client's request."""
    body = f'{{"model":"{model}","prompt":"{prompt}","max_tokens":8,"stream":false}}'.encode()
    headers = {
        ":method": "POST",
        ":path": "/v1/completions",
        ":authority": "bench",
        ":scheme": "http",
        "content-type": "application/json",
        "content-length": str(len(body)),
    }
    return headers, body


RESPONSE = b'{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}'


async def one(director: Director, headers: dict[str, str], body: bytes, ride: Callable[[], None]) -> None:
    """One request through the director, and ``ride`` where a replica's ext_proc edge calls it
    (after each read: the request's, then the response's), so the peer reads its sync
    connections as a routing replica does (``epp.server.quiet_reads``)."""
    lc = director.start(dict(headers), {}, can_hold_response=True)
    try:
        await lc.route(body)
        ride()
        await asyncio.sleep(RESPONSE_AFTER)
        lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
        lc.response_chunk(RESPONSE, True)
        ride()
    finally:
        lc.close()


def build_peer(config: str, endpoints: str) -> App:
    opts = parse_flags(
        [
            f"--endpoints={endpoints}",
            f"--config-file={config}",
            "--secure-serving=false",
            "--tracing=false",
            "--ha-enable-leader-election=false",
        ],
        {},
    )
    return build_app(opts, {})


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = [int(p) for p in args.ports.split(",") if p]
    ctx = zmq.asyncio.Context()  # one libzmq I/O thread for every replayed peer
    apps = [build_peer(args.config, args.endpoints) for _ in ports]
    for app in apps:  # as serve() starts them, short of the data layer and the servers
        for plugin in app.components.lifecycle:
            await plugin.start()
        for observer in app.components.observers:
            app.datastore.add_observer(observer)
    hubs: list[SyncHub] = []
    for i, (port, app) in enumerate(zip(ports, apps, strict=True), start=1):
        hub = SyncHub(
            f"bench-{i}",
            transport_for(args.transport, "127.0.0.1", port, context=ctx),
            interval=args.interval,
            warm_start_timeout=WARM_START,
        )
        hub.bind(app.components.plugins.values())
        hub.transport.bind()
        hubs.append(hub)
    replica = StaticPeers([Peer("bench-0", "127.0.0.1", args.replica)])
    await asyncio.gather(*(h.start(replica) for h in hubs))
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    line = await loop.run_in_executor(None, sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go', got {line!r}")
    cpu0 = time.process_time()
    work = [
        [request(p, args.model) for p in peer_prompts(256, i)] for i in range(1, len(ports) + 1)
    ]  # peer i's prompts are replica i's in the crowded cells
    rngs = [random.Random(2) for _ in ports]  # the load client's choice of variant, per replica
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    total = int(args.rate * args.seconds)
    made = 0
    for k in range(total):
        delay = start + k / args.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        for app, hub, reqs, rng in zip(apps, hubs, work, rngs, strict=True):
            headers, body = reqs[rng.randrange(len(reqs))]
            t = asyncio.create_task(one(app.director, headers, body, hub.transport.ride))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            made += 1
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - start
    await asyncio.sleep(0.1)  # the last batches leave
    sent = sum(h.stats.sent for h in hubs)
    await asyncio.gather(*(h.stop() for h in hubs))
    ctx.term()
    for app in apps:
        for plugin in app.components.lifecycle:
            await plugin.stop()
    return {"peers": len(ports), "requests": made, "batches_sent": sent, "cores": round(cpu / wall, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleout_peers", description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=int, required=True, help="replica 0's --peer-port")
    ap.add_argument("--ports", required=True, help="the replayed peers' sync ports (pairs: port and port+1)")
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--config", default=str(CONFIGS / "prefix-heavy.yaml"))
    ap.add_argument("--model", default="mock-model")
    ap.add_argument("--rate", type=float, required=True, help="requests a second per replayed peer")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="crossReplicaSyncInterval in seconds (0: the hub's default gap)",
    )
    ap.add_argument("--transport", default="h2", choices=("h2", "zmq"), help="replica 0's --peer-transport")
    args = ap.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the protocol
    print(json.dumps(uvloop.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
