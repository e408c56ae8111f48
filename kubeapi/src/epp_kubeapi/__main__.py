"""Run the fake apiserver as its own process, for manual runs and tests that need one outside pytest.

    python -m epp_kubeapi --kubeconfig /tmp/kubeconfig --inference-crds --seed objects.yaml

Prints the URL, writes the kubeconfig, and serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import yaml

from .server import KubeApiServer


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m epp_kubeapi", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--kubeconfig", type=Path, help="write a kubeconfig pointing at the server here")
    p.add_argument("--token", default="admin", help="the kubeconfig's bearer token (a system:masters user)")
    p.add_argument("--namespace", default="default", help="the kubeconfig context's namespace")
    p.add_argument("--inference-crds", action="store_true", help="serve GIE's InferencePool/Objective CRDs")
    p.add_argument("--no-objectives", action="store_true", help="with --inference-crds: only InferencePool")
    p.add_argument("--bookmark-interval", type=float, default=1.0)
    p.add_argument("--seed", type=Path, action="append", default=[], help="YAML file of objects to create")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    server = KubeApiServer(bookmark_interval=args.bookmark_interval)
    if args.inference_crds:
        server.register_inference_crds(objectives=not args.no_objectives)
    for path in args.seed:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                server.create(obj)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start(args.host, args.port)
    try:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig, token=args.token, namespace=args.namespace)
        print(server.url, flush=True)
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse(argv)))


if __name__ == "__main__":
    main()
