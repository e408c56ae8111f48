"""`epp-sim`: run a fleet of simulated vLLM replicas; prints one JSON line per listening port."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from epp_sim.config import (
    ENGINE_FIELDS,
    EngineConfig,
    FleetConfig,
    SimConfigError,
    engine_config,
    load_fleet_file,
    parse_override,
)
from epp_sim.fleet import Fleet

_HELP = {
    "model": "served model name (default: mock-model)",
    "time_scale": "wall seconds per modelled second; 0.01 runs 100x faster (default: 1.0)",
    "seed": "seed for generated text, EOS draws and faults (default: 0)",
    "num_gpu_blocks": "KV cache blocks per engine (default: 26000, ~416k tokens)",
    "metrics_style": "metric names: vllm, sglang, trtllm or triton (default: vllm)",
    "kv_events": "ZMQ endpoint for KV events: tcp://*:5557 binds (+ global rank), tcp://host:port connects",
    "kv_events_replay": "ZMQ ROUTER endpoint answering replay requests (vLLM's replay_endpoint), e.g. tcp://*:5558",
    "kv_events_buffer_steps": "KV event batches kept for replay (default: 10000)",
    "prefix_caching_hash_algo": "vLLM's --prefix-caching-hash-algo: sha256 (default), sha256_cbor, xxhash...",
    "hash_seed": "vLLM's PYTHONHASHSEED for NONE_HASH (default: that env var, else random)",
    "kv_events_topic": "topic template with {host} {port} {model} {rank} (default: kv@{host}:{port}@{model})",
    "lora_modules": "adapters served from the start: name or name=path",
    "eos_probability": "per-token chance to stop early unless ignore_eos (default: 0, always max_tokens)",
    "default_max_tokens": "max_tokens when a request sets none (default: 16)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epp-sim", description=__doc__)
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument("--replicas", type=int, help="number of replicas (default: 1)")
    fleet.add_argument("--base-port", type=int, help="first port; 0 = ephemeral ports (default: 0)")
    fleet.add_argument("--host", help="listen address (default: 127.0.0.1)")
    fleet.add_argument(
        "--dp-size", type=int, help="data-parallel ranks per replica, one port each (default: 1)"
    )
    fleet.add_argument("--name-prefix", help="replica names are <prefix>-<index> (default: sim)")
    fleet.add_argument(
        "--admin-port", type=int, help="serve the fleet admin API (/sim/faults) here; 0 = ephemeral"
    )
    fleet.add_argument("--grpc-base-port", type=int, help="also serve vLLM's gRPC engine API; 0 = ephemeral")
    fleet.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="SPEC",
        help="per-replica changes, e.g. 'replica=2,time-scale=3,slowdown=2' (repeatable)",
    )
    fleet.add_argument("--config", type=Path, help="fleet YAML file; command-line flags win over it")
    fleet.add_argument("--no-uvloop", action="store_true", help="use the default asyncio event loop")
    engine = parser.add_argument_group("engine (every replica; see docs/simulator.md)")
    for name, kind in ENGINE_FIELDS.items():
        flag = "--" + name.replace("_", "-")
        help_text = _HELP.get(name, f"see docs/simulator.md (default: {_default(name)})")
        if kind is bool:
            engine.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:
            engine.add_argument(flag, nargs="*", default=None, help=help_text)
        else:
            engine.add_argument(flag, default=None, help=help_text)
    return parser


def _default(name: str) -> Any:
    return getattr(EngineConfig(), name)


def build_config(args: argparse.Namespace) -> FleetConfig:
    kwargs: dict[str, Any] = load_fleet_file(args.config) if args.config else {}
    for name in ("replicas", "base_port", "host", "dp_size", "name_prefix", "admin_port", "grpc_base_port"):
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    given = {name: getattr(args, name) for name in ENGINE_FIELDS if getattr(args, name) is not None}
    kwargs["engine"] = engine_config(given, kwargs.get("engine"))
    overrides = list(kwargs.get("overrides", ()))
    overrides += [parse_override(spec) for spec in args.override]
    kwargs["overrides"] = tuple(overrides)
    return FleetConfig(**kwargs)


async def serve(config: FleetConfig, ready: asyncio.Event | None = None) -> None:
    """Run the fleet until SIGTERM or SIGINT; print one JSON line per listening port once serving."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Fleet(config) as fleet:
        for record in fleet.endpoints():
            sys.stdout.write(orjson.dumps(record).decode() + "\n")
        sys.stdout.flush()
        if ready is not None:
            ready.set()
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = build_config(args)
    except SimConfigError as exc:
        parser.error(str(exc))
    runner: types.ModuleType | None = None
    if not args.no_uvloop:
        try:
            import uvloop  # why: an optional speed-up, absent on some platforms

            runner = uvloop
        except ImportError:
            runner = None
    try:
        if runner is not None:
            runner.run(serve(config))
        else:
            asyncio.run(serve(config))
    except OSError as exc:
        sys.stderr.write(f"epp-sim: {exc}\n")
        raise SystemExit(1) from None
