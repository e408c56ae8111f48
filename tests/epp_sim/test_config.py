"""Tests of fleet configuration: overrides, coercion, YAML files, fault knobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epp_sim.config import (
    EngineConfig,
    Faults,
    FleetConfig,
    SimConfigError,
    engine_config,
    load_fleet_file,
    parse_override,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("replica=2,time-scale=3", {"replica": 2, "time_scale": "3"}, id="kebab-to-snake"),
        pytest.param(
            "replica=0, lora-modules=a;b , slowdown=2",
            {"replica": 0, "lora_modules": "a;b", "slowdown": "2"},
            id="spaces-and-lists",
        ),
    ],
)
def test_parse_override(text: str, expected: dict[str, Any]) -> None:
    """An override spec becomes snake-case keys with the replica index as an int."""
    assert parse_override(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("time-scale=3", "must name a replica", id="no-replica"),
        pytest.param("replica=1,slow", "is not key=value", id="not-key-value"),
        pytest.param("replica=x", "cannot convert", id="bad-index"),
    ],
)
def test_parse_override_errors(text: str, message: str) -> None:
    """Malformed overrides fail with a message naming the problem."""
    with pytest.raises(SimConfigError, match=message):
        parse_override(text)


def test_replica_configs_apply_overrides_to_one_replica() -> None:
    """Engine fields, fault knobs, names and dp_size change only on the replica the override names."""
    fleet = FleetConfig(
        replicas=3,
        engine=EngineConfig(time_scale=0.5),
        overrides=(
            parse_override("replica=1,time-scale=2,lora-modules=a;b=/p,slowdown=3"),
            {"replica": 2, "name": "odd-one", "dp_size": 2, "metrics_style": "sglang"},
        ),
    )
    first, second, third = fleet.replica_configs()
    assert (first.name, first.engine.time_scale, first.faults.slowdown) == ("sim-0", 0.5, 1.0)
    assert (second.engine.time_scale, second.engine.lora_modules, second.faults.slowdown) == (
        2.0,
        ("a", "b=/p"),
        3.0,
    )
    assert (third.name, third.dp_size, third.engine.metrics_style) == ("odd-one", 2, "sglang")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"replicas": 0}, "replicas must be > 0", id="no-replicas"),
        pytest.param({"overrides": ({"replica": 5},)}, "needs replica in", id="override-out-of-range"),
        pytest.param({"overrides": ({"replica": 0, "bogus": 1},)}, "unknown override key", id="unknown-key"),
        pytest.param({"role": "encode"}, "role must be one of", id="unknown-role"),
        pytest.param(
            {"overrides": ({"replica": 0, "role": "x"},)}, "role must be one of", id="bad-role-override"
        ),
    ],
)
def test_fleet_config_errors(kwargs: dict[str, Any], message: str) -> None:
    """Invalid fleets fail before any socket opens, naming the culprit."""
    with pytest.raises(SimConfigError, match=message):
        FleetConfig(**kwargs).replica_configs()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"time_scale": "0"}, "time_scale must be > 0", id="zero-time-scale"),
        pytest.param({"num_gpu_blocks": "-1"}, "num_gpu_blocks must be > 0", id="negative-blocks"),
        pytest.param({"metrics_style": "tgi"}, "metrics_style must be one of", id="unknown-style"),
        pytest.param({"enable_prefix_caching": "maybe"}, "cannot convert", id="bad-bool"),
        pytest.param({"max_loras": "0"}, "max_loras must be >= 1", id="lora-without-slots"),
        pytest.param({"kv_transfer_timeout_s": "0"}, "kv_transfer_timeout_s must be > 0", id="no-kv-timeout"),
        pytest.param({"kv_transfer_ms_per_token": "-1"}, "must be >= 0", id="negative-transfer"),
        pytest.param({"nope": 1}, "unknown engine parameter", id="unknown-field"),
    ],
)
def test_engine_config_errors(values: dict[str, Any], message: str) -> None:
    """Engine values are coerced from strings and validated."""
    with pytest.raises(SimConfigError, match=message):
        engine_config(values)


def test_engine_config_coerces_strings() -> None:
    """Command-line strings become the field types, including optionals and lists."""
    config = engine_config(
        {"max_num_seqs": "8", "enable_lora": "false", "kv_events": "none", "lora_modules": "x;y", "seed": 3}
    )
    assert (config.max_num_seqs, config.enable_lora, config.kv_events, config.lora_modules, config.seed) == (
        8,
        False,
        None,
        ("x", "y"),
        3,
    )


def test_load_fleet_file(tmp_path: Path) -> None:
    """A YAML fleet file gives fleet fields, engine defaults and per-replica overrides."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "replicas: 2\nbase-port: 0\nengine:\n  time-scale: 0.1\n  max-loras: 2\n"
        "overrides:\n  - replica: 1\n    num-gpu-blocks: 64\n    refuse-connections: true\n"
    )
    fleet = FleetConfig(**load_fleet_file(path))
    a, b = fleet.replica_configs()
    assert (a.engine.time_scale, a.engine.max_loras, a.engine.num_gpu_blocks) == (0.1, 2, 26_000)
    assert (b.engine.num_gpu_blocks, b.faults.refuse_connections) == (64, True)


def test_load_fleet_file_rejects_unknown_keys(tmp_path: Path) -> None:
    """A typo in a fleet file is an error naming the key."""
    path = tmp_path / "fleet.yaml"
    path.write_text("replica: 2\n")
    with pytest.raises(SimConfigError, match="unknown key 'replica'"):
        load_fleet_file(path)


def test_faults_update() -> None:
    """Fault changes accept kebab keys and strings; unknown faults are rejected."""
    faults = Faults()
    faults.update({"metrics-delay-s": "1.5", "crashed": "true", "error_rate": 0.25})
    assert (faults.metrics_delay_s, faults.crashed, faults.error_rate) == (1.5, True, 0.25)
    with pytest.raises(SimConfigError, match="unknown fault 'explode'"):
        faults.update({"explode": True})


def test_roles_default_to_both_and_an_override_changes_one() -> None:
    config = FleetConfig(replicas=3, role="decode", overrides=({"replica": 0, "role": "prefill"},))
    assert [r.role for r in config.replica_configs()] == ["prefill", "decode", "decode"]
    assert {r.role for r in FleetConfig(replicas=2).replica_configs()} == {"both"}
