"""``python -m epp_sim.pdproxy`` / ``epp-pd-proxy``: the decode-side P/D proxy (llm-d's sidecar flags)."""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from epp_sim.pdproxy.proxy import PdProxy, ProxyConfig
from epp_sim.rank import listen_socket

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*$")


def duration(text: str) -> float:
    """A Go-style duration (``200ms``, ``1.5s``, ``2m``) or plain seconds, in seconds."""
    m = _DURATION.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 200ms, 1.5s)")
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "ms" else value * 60 if m.group(2) == "m" else value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp-pd-proxy", description=__doc__)
    p.add_argument(
        "--port", type=int, default=8000, help="listen port, the pool's target port (default 8000)"
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument(
        "--vllm-port", type=int, default=8200, help="the local decode engine's port (default 8200)"
    )
    p.add_argument("--vllm-host", default="127.0.0.1", help="the local decode engine's address")
    p.add_argument(
        "--prefill-max-retries", type=int, default=0, help="retries of a prefill leg answered 502/503/504"
    )
    p.add_argument(
        "--prefill-retry-backoff", type=duration, default=0.2, help="wait between retries (default 200ms)"
    )
    p.add_argument(
        "--prefill-timeout", type=duration, default=300.0, help="give up a prefill leg (504) after this"
    )
    p.add_argument(
        "--enable-prefiller-sampling",
        action="store_true",
        help="pick a random prefiller of a comma list instead of the first",
    )
    p.add_argument(
        "--kv-connector", choices=("nixlv2",), default="nixlv2", help="KV connector protocol (nixlv2 only)"
    )
    return p


async def serve(config: ProxyConfig) -> None:
    """Serve until SIGTERM/SIGINT; print one JSON line with the listening port once it listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(PdProxy(config).app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    sock = listen_socket(config.host, config.port)
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    record = {"protocol": "pd-proxy", "host": config.host, "port": port, "vllm_port": config.vllm_port}
    sys.stdout.write(orjson.dumps(record).decode() + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    config = ProxyConfig(
        port=args.port,
        host=args.host,
        vllm_host=args.vllm_host,
        vllm_port=args.vllm_port,
        prefill_max_retries=args.prefill_max_retries,
        prefill_retry_backoff_s=args.prefill_retry_backoff,
        prefill_timeout_s=args.prefill_timeout,
        enable_prefiller_sampling=args.enable_prefiller_sampling,
    )
    try:
        import uvloop  # why: an optional speed-up, absent on some platforms

        uvloop.run(serve(config))
    except ImportError:
        asyncio.run(serve(config))


if __name__ == "__main__":
    main()
