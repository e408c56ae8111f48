"""Engine, replica and fleet configuration: defaults, per-replica overrides, YAML files."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from epp_sim.hashing import HASH_ALGOS

MetricsStyle = Literal["vllm", "sglang", "trtllm", "triton"]
METRICS_STYLES: Final = ("vllm", "sglang", "trtllm", "triton")
Role = Literal["prefill", "decode", "both"]
ROLES: Final = ("prefill", "decode", "both")


class SimConfigError(ValueError):
    """A configuration value, override or file is invalid; the message names the culprit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """One engine (one DP rank). Defaults resemble an 8B model in bf16 on one H100 (docs/simulator.md)."""

    model: str = "mock-model"
    time_scale: float = 1.0  # wall seconds per modelled second; 0.01 runs 100x faster than modelled
    seed: int = 0
    # KV cache and batching (vLLM names and defaults)
    block_size: int = 16
    num_gpu_blocks: int = 26_000  # ~416k tokens: 0.9 x 80 GB minus weights, at 128 KiB per token
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32_768
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"  # vLLM's --prefix-caching-hash-algo
    hash_seed: str | None = None  # vLLM's PYTHONHASHSEED for NONE_HASH; None: that env var, else random
    enable_prompt_tokens_details: bool = False
    # time model: step_ms = base + prefill·tokens + per_seq·decodes + per_1k_context·ctx/1000 + lora loads
    step_base_ms: float = 6.0
    prefill_ms_per_token: float = 0.05
    decode_ms_per_seq: float = 0.08
    decode_ms_per_1k_context: float = 0.04
    lora_load_ms: float = 25.0
    # P/D: a request with kv_transfer_params.do_remote_prefill waits for its prompt's KV over a link
    # shared by concurrent transfers (kv_transfer.py): ~25 GB/s at 128 KiB per token = 10x prefill speed
    kv_transfer_ms_per_token: float = 0.005
    kv_transfer_base_ms: float = 2.0
    kv_transfer_timeout_s: float = 60.0  # modelled seconds a decode waits for its KV before failing
    # LoRA
    enable_lora: bool = True
    max_loras: int = 1
    lora_modules: tuple[str, ...] = ()
    # outputs
    default_max_tokens: int = 16
    eos_probability: float = 0.0
    embedding_dim: int = 32
    # observability
    metrics_style: MetricsStyle = "vllm"
    kv_events: str | None = None  # ZMQ endpoint; bind if it has "*" or port 0, else connect
    kv_events_topic: str = "kv@{host}:{port}@{model}"
    kv_events_replay: str | None = None  # ZMQ ROUTER endpoint serving replays (vLLM's replay_endpoint)
    kv_events_buffer_steps: int = 10_000  # batches kept for replay (vLLM's buffer_steps)

    def __post_init__(self) -> None:
        positive = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        for name in positive:
            if getattr(self, name) <= 0:
                raise SimConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("kv_transfer_ms_per_token", "kv_transfer_base_ms"):
            if getattr(self, name) < 0:
                raise SimConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kv_transfer_timeout_s <= 0:
            raise SimConfigError(f"kv_transfer_timeout_s must be > 0, got {self.kv_transfer_timeout_s}")
        if self.time_scale <= 0:
            raise SimConfigError(f"time_scale must be > 0, got {self.time_scale}")
        if self.enable_lora and self.max_loras < 1:
            raise SimConfigError(f"max_loras must be >= 1 when LoRA is enabled, got {self.max_loras}")
        if not 0.0 <= self.eos_probability <= 1.0:
            raise SimConfigError(f"eos_probability must be in [0, 1], got {self.eos_probability}")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise SimConfigError(
                f"prefix_caching_hash_algo must be one of {HASH_ALGOS}, got {self.prefix_caching_hash_algo!r}"
            )
        if self.metrics_style not in METRICS_STYLES:
            raise SimConfigError(f"metrics_style must be one of {METRICS_STYLES}, got {self.metrics_style!r}")


@dataclass(slots=True, kw_only=True)
class Faults:
    """Fault knobs of one rank, mutable at run time (Fleet.set_faults or POST /sim/faults)."""

    metrics_delay_s: float = 0.0  # real seconds before /metrics answers
    metrics_status: int = 200  # non-200 makes /metrics fail with this status
    metrics_stall: bool = False  # /metrics accepts the request and never answers (inference still does)
    inference_stall: bool = False  # inference requests are accepted and never answered (/metrics still is)
    refuse_connections: bool = False  # close the listening socket: new connections are refused
    crashed: bool = False  # abort in-flight connections, stop listening, lose all engine state
    unhealthy: bool = False  # /health answers 503
    error_rate: float = 0.0  # fraction of inference requests answered with error_status
    error_status: int = 500  # the status of those answers (503 makes a prefill pod retryable)
    slowdown: float = 1.0  # multiplier on every step's modelled time
    latency_spike_prob: float = 0.0  # per-step probability of a latency spike
    latency_spike_ms: float = 0.0  # modelled milliseconds added by a spike
    paused: bool = False  # the engine stops stepping; requests queue up
    kv_events_drop: int = 0  # the next N KV event batches take a sequence number but are not sent (a gap)
    kv_transfer_stall: bool = False  # KV transfers into this rank move no bytes (they time out)
    # KV events (issue 29): the publisher goes quiet while the engine serves (batches take their
    # seq, nothing is sent); and a restart under another --prefix-caching-hash-algo / PYTHONHASHSEED
    # (a rolling upgrade): changing either restarts the engine with it ("" / None: the configured one)
    kv_events_silent: bool = False
    restart_hash_algo: str = ""
    restart_hash_seed: str | None = None

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply `changes` (snake or kebab keys), coercing strings; unknown keys raise SimConfigError."""
        for key, value in changes.items():
            name = key.replace("-", "_")
            if name not in FAULT_FIELDS:
                raise SimConfigError(f"unknown fault {key!r}; known: {', '.join(sorted(FAULT_FIELDS))}")
            setattr(self, name, coerce(FAULT_FIELDS[name], value, name))
        if self.restart_hash_algo and self.restart_hash_algo not in HASH_ALGOS:
            bad, self.restart_hash_algo = self.restart_hash_algo, ""
            raise SimConfigError(f"restart_hash_algo must be one of {HASH_ALGOS}, got {bad!r}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaConfig:
    """One replica (a pod): `dp_size` ranks, each an engine on its own port."""

    index: int
    name: str
    dp_size: int = 1
    role: Role = "both"  # P/D role, reported to discovery (llm-d.ai/role); every role serves every leg
    engine: EngineConfig = field(default_factory=EngineConfig)
    faults: Faults = field(default_factory=Faults)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """N replicas in one process; `overrides` maps a replica index to changed fields."""

    replicas: int = 1
    host: str = "127.0.0.1"
    base_port: int = 0  # 0: every port ephemeral; else replica i rank r listens on base + i*dp + r
    dp_size: int = 1
    name_prefix: str = "sim"
    role: Role = "both"  # P/D role of every replica (an override may change one)
    admin_port: int | None = None  # fleet-wide admin HTTP server (0 = ephemeral); None = off
    grpc_base_port: int | None = None  # also serve the vLLM gRPC engine API (0 = ephemeral); None = off
    engine: EngineConfig = field(default_factory=EngineConfig)
    overrides: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            raise SimConfigError(f"replicas must be > 0, got {self.replicas}")
        if self.dp_size <= 0:
            raise SimConfigError(f"dp_size must be > 0, got {self.dp_size}")
        if self.role not in ROLES:
            raise SimConfigError(f"role must be one of {ROLES}, got {self.role!r}")
        for override in self.overrides:
            index = override.get("replica")
            if not isinstance(index, int) or not 0 <= index < self.replicas:
                raise SimConfigError(f"override {dict(override)} needs replica in [0, {self.replicas})")

    def replica_configs(self) -> list[ReplicaConfig]:
        """Every replica's configuration with its overrides applied, in index order."""
        configs = []
        for index in range(self.replicas):
            engine_changes: dict[str, Any] = {}
            fault_changes: dict[str, Any] = {}
            top: dict[str, Any] = {
                "name": f"{self.name_prefix}-{index}",
                "dp_size": self.dp_size,
                "role": self.role,
            }
            for override in self.overrides:
                if override["replica"] != index:
                    continue
                for key, value in override.items():
                    name = key.replace("-", "_")
                    if name == "replica":
                        continue
                    if name in ENGINE_FIELDS:
                        engine_changes[name] = coerce(ENGINE_FIELDS[name], value, name)
                    elif name in FAULT_FIELDS:
                        fault_changes[name] = value
                    elif name in ("name", "dp_size", "role"):
                        top[name] = coerce(_TOP_FIELDS[name], value, name)
                    else:
                        raise SimConfigError(f"unknown override key {key!r} for replica {index}")
            faults = Faults()
            faults.update(fault_changes)
            configs.append(
                ReplicaConfig(
                    index=index,
                    name=top["name"],
                    dp_size=top["dp_size"],
                    role=top["role"],
                    engine=dataclasses.replace(self.engine, **engine_changes),
                    faults=faults,
                )
            )
        return configs


def parse_override(text: str) -> dict[str, Any]:
    """`'replica=2,time-scale=3,lora-modules=a;b'` → `{'replica': 2, 'time_scale': '3', ...}`."""
    result: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise SimConfigError(f"override part {part!r} is not key=value (in {text!r})")
        result[key.strip().replace("-", "_")] = value.strip()
    if "replica" not in result:
        raise SimConfigError(f"override {text!r} must name a replica, e.g. 'replica=2,time-scale=3'")
    result["replica"] = coerce(int, result["replica"], "replica")
    return result


def load_fleet_file(path: Path) -> dict[str, Any]:
    """Read a fleet YAML file into FleetConfig keyword arguments (engine as an EngineConfig)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SimConfigError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise SimConfigError(f"{path}: top level must be a mapping")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name == "engine":
            kwargs["engine"] = engine_config({k.replace("-", "_"): v for k, v in (value or {}).items()})
        elif name == "overrides":
            overrides = []
            for item in value or ():
                normalised = {k.replace("-", "_"): v for k, v in item.items()}
                normalised["replica"] = coerce(int, normalised.get("replica"), "replica")
                overrides.append(normalised)
            kwargs["overrides"] = tuple(overrides)
        elif name in FLEET_FIELDS:
            kwargs[name] = coerce(FLEET_FIELDS[name], value, name)
        else:
            raise SimConfigError(f"{path}: unknown key {key!r}")
    return kwargs


def engine_config(values: Mapping[str, Any], base: EngineConfig | None = None) -> EngineConfig:
    """An EngineConfig from snake-case values (strings are coerced), on top of `base`."""
    changes = {}
    for key, value in values.items():
        if key not in ENGINE_FIELDS:
            raise SimConfigError(f"unknown engine parameter {key!r}")
        changes[key] = coerce(ENGINE_FIELDS[key], value, key)
    return dataclasses.replace(base or EngineConfig(), **changes)


def coerce(kind: Any, value: Any, name: str) -> Any:
    """Coerce a YAML or command-line value to a field's type; raises SimConfigError naming the field."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            return None
        return coerce(next(a for a in args if a is not type(None)), value, name)
    if origin is Literal:
        if value not in args:
            raise SimConfigError(f"{name} must be one of {args}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(";") if v.strip())
        if isinstance(value, list | tuple):
            return tuple(str(v) for v in value)
        raise SimConfigError(f"{name} must be a list, got {value!r}")
    try:
        if kind is bool:
            return _boolean(value)
        if kind in (int, float, str):
            return kind(value)
    except (TypeError, ValueError) as exc:
        raise SimConfigError(f"{name}: cannot convert {value!r} to {kind.__name__}") from exc
    raise SimConfigError(f"{name}: unsupported type {kind!r}")


def _boolean(value: Any) -> bool:
    if not isinstance(value, str):
        return bool(value)
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


ENGINE_FIELDS: Final = _hints(EngineConfig)
FAULT_FIELDS: Final = _hints(Faults)
_TOP_FIELDS: Final = {"name": str, "dp_size": int, "role": Role}
FLEET_FIELDS: Final = {k: v for k, v in _hints(FleetConfig).items() if k not in ("engine", "overrides")}
