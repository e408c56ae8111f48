"""Tests of the `epp-sim` command: flags to configuration, JSON port lines, clean shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from epp_sim.cli import build_config, build_parser, main


def test_flags_build_the_fleet_config() -> None:
    """Fleet flags, engine flags (including booleans and lists) and overrides all land in FleetConfig."""
    argv = "--replicas 3 --dp-size 2 --time-scale 0.5 --no-enable-prefix-caching --lora-modules a b=/p"
    argv += " --metrics-style sglang --override replica=1,slowdown=4"
    config = build_config(build_parser().parse_args(argv.split()))
    assert (config.replicas, config.dp_size, config.engine.time_scale) == (3, 2, 0.5)
    assert (config.engine.enable_prefix_caching, config.engine.lora_modules) == (False, ("a", "b=/p"))
    assert config.engine.metrics_style == "sglang"
    assert config.replica_configs()[1].faults.slowdown == 4.0
    assert config.role == "both"
    assert build_config(build_parser().parse_args(["--role", "prefill"])).role == "prefill"


def test_command_line_wins_over_config_file(tmp_path: Path) -> None:
    """A YAML file supplies defaults; explicit flags override it and overrides from both apply."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "replicas: 4\nengine:\n  model: from-file\n  seed: 7\noverrides:\n  - {replica: 0, slowdown: 2}\n"
    )
    config = build_config(
        build_parser().parse_args(
            ["--config", str(path), "--model", "from-flag", "--override", "replica=3,seed=1"]
        )
    )
    assert (config.replicas, config.engine.model, config.engine.seed) == (4, "from-flag", 7)
    replicas = config.replica_configs()
    assert (replicas[0].faults.slowdown, replicas[3].engine.seed) == (2.0, 1)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--time-scale", "0"], id="bad-engine-value"),
        pytest.param(["--override", "slowdown=2"], id="override-without-replica"),
        pytest.param(["--replicas", "2", "--override", "replica=5,seed=1"], id="override-out-of-range"),
    ],
)
def test_bad_configuration_exits_with_usage_error(argv: list[str]) -> None:
    """Invalid configuration is a usage error (exit status 2) before anything listens."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2


async def test_process_prints_ports_serves_and_stops_on_sigterm() -> None:
    """The process prints one JSON line per port, serves on them, and exits 0 on SIGTERM."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "epp_sim", "--replicas", "2", "--admin-port", "0", "--time-scale", "0.01",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        records = [orjson.loads(await asyncio.wait_for(process.stdout.readline(), 30)) for _ in range(3)]
        async with aiohttp.ClientSession() as http:
            for record in records[:2]:
                async with http.get(f"http://{record['host']}:{record['port']}/health") as response:
                    assert response.status == 200
                    assert response.headers["x-inference-pod"] == record["name"]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert [(r["name"], r["protocol"]) for r in records] == [
        ("sim-0", "http"),
        ("sim-1", "http"),
        ("admin", "admin"),
    ]
