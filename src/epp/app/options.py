"""``Options``: every setting the command line gives the EPP, each flag declared once — name,
type, default, help and checks.

It lives with the application, not the command line, because the application is built from
it (``compose``, ``serve``, ``reload``) and sits below ``epp.cli``.  Each flag is a field of
``Options`` whose default is made by ``_flag`` (or ``_metrics_flag`` for the deprecated
``--model-server-metrics-*`` flags, declared with the parameters they stand for): the flag's
name is the field's name with dashes, and its pflag type, help group, help text and checks
ride in the field's metadata.  ``FLAGS`` is read from the fields, so the parser
(``cli/flags.py``), ``--help`` and docs/flags.md's test cannot drift from it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from epp.datalayer.engines import builtin_engine
from epp.datalayer.sources.metrics_http import MODEL_SERVER_METRICS_FLAGS, ModelServerMetricsFlags
from epp.errors import ConfigError
from epp.metrics.llmd import parse_families
from epp.sync.peers import parse_peers
from epp.units import format_go_duration, go_quote, parse_go_atoi

T = TypeVar("T")

Mode = Literal["pool", "selector", "endpoints", "endpoints-file"]
# pflag's value types; ``hostports`` is a string on the command line, parsed once discovery is known.
Kind = Literal["bool", "int", "str", "duration", "ints", "hostports"]
# A check on a flag's final value (default or given), after parsing: raises ConfigError naming the flag.
Check = Callable[[str, Any], None]

STATIC_POOL_NAME: Final = "epp"  # pool label in --endpoints/--endpoints-file mode when POD_NAME says nothing


@dataclass(frozen=True, slots=True)
class HostPort:
    """One ``--endpoints`` entry; ``host`` is an IP literal (IPv6 without brackets) or a DNS name."""

    host: str
    port: int

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """One flag: everything the parser, ``--help`` and the checks need, read from its field."""

    name: str
    attr: str  # the Options field
    kind: Kind
    group: str
    help: str
    new: bool = False  # not a GIE flag
    shorthand: str = ""
    # On the text given, while parsing: a ValueError becomes pflag's "invalid argument" message.
    syntax: Callable[[str], None] | None = None
    check: Check | None = None
    rejected: str = ""  # a removed flag: giving it at all is this error

    @property
    def display(self) -> str:
        return f"-{self.shorthand}, --{self.name}" if self.shorthand else f"--{self.name}"


_SPEC: Final = "flag"


def _flag(
    default: T,
    kind: Kind,
    group: str,
    help: str,
    *,
    new: bool = False,
    shorthand: str = "",
    syntax: Callable[[str], None] | None = None,
    check: Check | None = None,
    rejected: str = "",
) -> T:
    """A flag's declaration: the field's default, the rest in its metadata."""
    spec = {
        "kind": kind,
        "group": group,
        "help": help,
        "new": new,
        "shorthand": shorthand,
        "syntax": syntax,
        "check": check,
        "rejected": rejected,
    }
    return field(default=default, metadata={_SPEC: spec})


_METRICS_DEFAULTS: Final = ModelServerMetricsFlags()


def _metrics_flag(name: str, *, check: Check | None = None) -> Any:
    """A deprecated ``--model-server-metrics-*`` flag: kind, help and default are the data source's."""
    (declared,) = (f for f in MODEL_SERVER_METRICS_FLAGS if f.flag == name)
    default = getattr(_METRICS_DEFAULTS, declared.attr)
    return _flag(default, declared.kind, _METRICS, declared.help, check=check)


# --- checks --------------------------------------------------------------------------------------


def _port(name: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"invalid port number {value} in {go_quote(name)}")


def _one_of(*choices: str) -> Check:
    allowed = " or ".join(f"'{c}'" for c in choices)

    def check(name: str, value: str) -> None:
        if value not in choices:
            raise ConfigError(
                f"unexpected {go_quote(value)} value for {go_quote(name)} flag, "
                f"it can only be set to {allowed}"
            )

    return check


def _in_range(low: int, high: int | None = None, rule: str = "") -> Check:
    rule = rule or f"must be in [{low}, {high}]"

    def check(name: str, value: int) -> None:
        if value < low or (high is not None and value > high):
            raise ConfigError(f"invalid value {value} for {go_quote(name)}: {rule}")

    return check


def _not_negative(name: str, seconds: float) -> None:
    if seconds < 0:
        raise ConfigError(
            f"invalid value {go_quote(format_go_duration(seconds))} for {go_quote(name)}: "
            "must not be negative"
        )


def _positive(name: str, seconds: float) -> None:
    if seconds <= 0:
        raise ConfigError(
            f"invalid value {go_quote(format_go_duration(seconds))} for {go_quote(name)}: must be positive"
        )


def _peer_list(name: str, value: str) -> None:
    parse_peers(value, f"--{name}")


def _ip_address(name: str, value: str) -> None:
    if not value:
        return
    try:
        ipaddress.ip_address(value.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise ConfigError(
            f"invalid value {go_quote(value)} for {go_quote(name)}: not an IP address"
        ) from None


def _families(name: str, value: str) -> None:
    try:
        parse_families(value)
    except ValueError as e:
        raise ConfigError(f"invalid value {go_quote(value)} for {go_quote(name)}: {e}") from None


# controller-runtime's zap flags: parsed so typos fail; only the level is used.
_ZAP_LEVELS: Final = frozenset({"debug", "info", "error", "panic"})
_ZAP_STACK_LEVELS: Final = frozenset({"info", "error", "panic"})
_ZAP_TIME_ENCODINGS: Final = frozenset({"rfc3339nano", "rfc3339", "iso8601", "millis", "nanos", "epoch"})


def _zap_encoder(s: str) -> None:
    if s.lower() not in ("json", "console"):
        raise ValueError(f"invalid encoder value {go_quote(s)}")


def _zap_level(s: str) -> None:
    if s.lower() in _ZAP_LEVELS:
        return
    try:
        n = parse_go_atoi(s)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"invalid log level {go_quote(s)}")


def _zap_stacktrace(s: str) -> None:
    if s.lower() not in _ZAP_STACK_LEVELS:
        raise ValueError(f"invalid stacktrace level {go_quote(s)}")


def _zap_time_encoding(s: str) -> None:
    if s.lower() not in _ZAP_TIME_ENCODINGS:
        raise ValueError(f"invalid time-encoding value {go_quote(s)}")


# --- the flags -----------------------------------------------------------------------------------

_SERVER: Final = "Envoy ext_proc server"
_DISCOVERY: Final = (
    "Endpoint discovery (exactly one of --pool-name, --endpoint-selector, --endpoints, --endpoints-file)"
)
_CONFIG: Final = "Configuration"
_METRICS: Final = "Model-server metrics"
_OBS: Final = "Observability"
_LOG: Final = "Logging"
_SYNC: Final = "Cross-replica sync (active-active replicas, docs/scale-out.md)"

_VLLM: Final = builtin_engine("vllm")  # the removed --*-metric flags' defaults
_USE_ENGINE_CONFIGS: Final = "Rejected if set: use engineConfigs."
_REMOVED_METRIC: Final = "configure metrics via engineConfigs in EndpointPickerConfig instead"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """Every flag, by its flag name in snake_case (durations are float seconds), then derived values."""

    # Envoy ext_proc server
    grpc_port: int = _flag(
        9002, "int", _SERVER, "gRPC port used for communicating with Envoy proxy.", check=_port
    )
    bind_address: str = _flag(  # empty: all interfaces, as GIE's ":<port>"
        "",
        "str",
        _SERVER,
        "IP address the ext_proc, health and metrics servers listen on; empty means all interfaces.",
        new=True,
        check=_ip_address,
    )
    secure_serving: bool = _flag(True, "bool", _SERVER, "Enables secure serving (TLS on the ext_proc port).")
    cert_path: str = _flag(
        "",
        "str",
        _SERVER,
        "Directory holding tls.crt and tls.key for secure serving; if empty and secure serving is "
        "enabled, a self-signed certificate is generated at startup.",
    )
    enable_cert_reload: bool = _flag(
        False, "bool", _SERVER, "Reload the certificate in --cert-path when its files change."
    )
    health_checking: bool = _flag(
        False, "bool", _SERVER, "Also serve the gRPC health service on the ext_proc port (reports SERVING)."
    )
    grpc_health_port: int = _flag(
        9003, "int", _SERVER, "The port used for gRPC liveness and readiness probes.", check=_port
    )
    ha_enable_leader_election: bool = _flag(
        False,
        "bool",
        _SERVER,
        "Enables leader election for high availability; readiness passes only on the leader.",
    )
    leader_election_lease_duration: float = _flag(
        15.0,
        "duration",
        _SERVER,
        "How long a leader's lease lasts without renewal before another replica may take it.",
        new=True,
    )
    leader_election_renew_deadline: float = _flag(
        10.0,
        "duration",
        _SERVER,
        "How long the leader keeps trying to renew its lease before it stops acting as leader.",
        new=True,
    )
    leader_election_retry_period: float = _flag(
        2.0,
        "duration",
        _SERVER,
        "How often candidates try to acquire, and the leader to renew, the lease.",
        new=True,
    )
    max_request_body_bytes: int = _flag(
        64 * 1024 * 1024,
        "int",
        _SERVER,
        "Largest request body buffered for parsing; larger requests get 413. 0 means unlimited.",
        new=True,
        check=_in_range(0, rule="must be >= 0 (0 means unlimited)"),
    )
    shutdown_delay: float = _flag(
        5.0,
        "duration",
        _SERVER,
        "On SIGTERM, keep accepting new streams (while health says NOT_SERVING) until none arrived for "
        "500ms, at most this long, so the proxy moves traffic away before the port closes.",
        new=True,
        check=_not_negative,
    )
    shutdown_grace_period: float = _flag(
        20.0,
        "duration",
        _SERVER,
        "On SIGTERM, how long open streams may finish before the server stops.",
        new=True,
        check=_not_negative,
    )
    ext_proc_transport: str = _flag(
        "h2",
        "str",
        _SERVER,
        "gRPC implementation serving ext_proc: h2 (the EPP's own HTTP/2 framing on the event loop) "
        "or grpcio (grpc.aio).",
        new=True,
        check=_one_of("h2", "grpcio"),
    )
    grpc_max_concurrent_streams: int = _flag(
        1000,
        "int",
        _SERVER,
        "Streams one ext_proc client connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS); "
        "more are refused with REFUSED_STREAM and the proxy opens another connection.",
        new=True,
        check=_in_range(1, 0x7FFFFFFF),
    )
    grpc_max_message_bytes: int = _flag(
        20 * 1024 * 1024,
        "int",
        _SERVER,
        "Largest gRPC message received on the ext_proc port; a longer one ends its call with "
        "RESOURCE_EXHAUSTED. Must hold the largest body Envoy sends in one message (BUFFERED mode: "
        "its buffer limit).",
        new=True,
        check=_in_range(1, 0x7FFFFFFF - 5),  # the length prefix is 4 bytes after a flag byte
    )
    grpc_keepalive_time: float = _flag(
        7200.0,
        "duration",
        _SERVER,
        "After this long without reading anything from an ext_proc connection, PING it; 0 disables.",
        new=True,
        check=_not_negative,
    )
    grpc_keepalive_timeout: float = _flag(
        20.0,
        "duration",
        _SERVER,
        "How long a keepalive PING may go unanswered before the connection is closed.",
        new=True,
        check=_not_negative,
    )
    grpc_max_connection_idle: float = _flag(
        3600.0,
        "duration",
        _SERVER,
        "Close (GOAWAY) an ext_proc connection that had no open stream for this long; 0 disables.",
        new=True,
        check=_not_negative,
    )
    # --workers (docs/workers.md): processes sharing the ext_proc port; the supervisor is epp.workers
    workers: int = _flag(
        0,
        "int",
        _SERVER,
        "Worker processes sharing the ext_proc port (SO_REUSEPORT), worker 0 serving health and the "
        "merged /metrics; 0: the cores the pod may use (CPU affinity capped by the cgroup quota); "
        "1: one process, no supervisor.",
        new=True,
        check=_in_range(0, 1024),
    )
    # endpoint discovery
    pool_name: str = _flag(
        "", "str", _DISCOVERY, "Name of the InferencePool this Endpoint Picker is associated with."
    )
    pool_namespace: str = _flag(
        "",
        "str",
        _DISCOVERY,
        "Namespace of the InferencePool (and of the EPP in standalone mode); "
        "empty means env NAMESPACE, else 'default'.",
    )
    pool_group: str = _flag(
        "inference.networking.k8s.io", "str", _DISCOVERY, "Kubernetes API group of the InferencePool."
    )
    kubeconfig: str = _flag(
        "",
        "str",
        _DISCOVERY,
        "Path to a kubeconfig; empty means $KUBECONFIG, then the in-cluster service account, "
        "then ~/.kube/config.",
    )
    endpoint_selector: str = _flag(
        "",
        "str",
        _DISCOVERY,
        "Standalone mode: select model server pods by labels, 'key=value' pairs separated by commas "
        "(e.g. 'app=vllm-llama3-8b-instruct,env=prod'); needs env POD_NAME.",
    )
    endpoint_target_ports: tuple[int, ...] = _flag(
        (),
        "ints",
        _DISCOVERY,
        "Standalone mode: target ports of model server pods, comma-separated (e.g. '3000,3001').",
    )
    endpoints: tuple[HostPort, ...] = _flag(
        (),
        "hostports",
        _DISCOVERY,
        "Without Kubernetes: a fixed list of model servers, HOST:PORT[,HOST:PORT...] ([::1]:8000 for IPv6).",
        new=True,
    )
    endpoints_file: str = _flag(
        "", "str", _DISCOVERY, "Without Kubernetes: a YAML file listing model servers.", new=True
    )
    objectives_file: str = _flag(
        "",
        "str",
        _DISCOVERY,
        "Without an InferencePool: a YAML file of InferenceObjective and InferenceModelRewrite objects.",
        new=True,
    )
    disable_endpoint_subset_filter: bool = _flag(
        False, "bool", _DISCOVERY, "Ignore the x-gateway-destination-endpoint-subset hint sent by the proxy."
    )
    emit_endpoint_scores: bool = _flag(
        False,
        "bool",
        _DISCOVERY,
        "Add every candidate's final scheduler score to the routing reply's envoy.lb dynamic metadata "
        "under 'x-gateway-destination-endpoint-scores' (llm-d-router's flag), and each scorer's weighted "
        "score under 'x-gateway-destination-endpoint-score-breakdown'.",
    )
    # configuration
    config_file: str = _flag("", "str", _CONFIG, "The path to the EndpointPickerConfig file.")
    config_text: str = _flag("", "str", _CONFIG, "The EndpointPickerConfig as text, in lieu of a file.")
    config_reload_interval: float = _flag(
        0.25,
        "duration",
        _CONFIG,
        "How often --config-file's content is checked for a change to apply live (0: on SIGHUP only).",
        new=True,
        check=_not_negative,
    )
    # model-server metrics
    model_server_metrics_scheme: str = _metrics_flag(
        "model-server-metrics-scheme", check=_one_of("http", "https")
    )
    model_server_metrics_path: str = _metrics_flag("model-server-metrics-path")
    model_server_metrics_port: int = _metrics_flag("model-server-metrics-port")
    model_server_metrics_https_insecure_skip_verify: bool = _metrics_flag(
        "model-server-metrics-https-insecure-skip-verify"
    )
    refresh_metrics_interval: float = _flag(
        0.05, "duration", _METRICS, "Interval to refresh metrics of each endpoint."
    )
    refresh_prometheus_metrics_interval: float = _flag(
        5.0, "duration", _METRICS, "Interval to recompute the inference_pool_* gauges."
    )
    metrics_staleness_threshold: float = _flag(
        2.0, "duration", _METRICS, "Endpoint metrics older than this are left out of the pool gauges."
    )
    total_queued_requests_metric: str = _flag(
        _VLLM.queued_requests_spec, "str", _METRICS, _USE_ENGINE_CONFIGS, rejected=_REMOVED_METRIC
    )
    total_running_requests_metric: str = _flag(
        _VLLM.running_requests_spec, "str", _METRICS, _USE_ENGINE_CONFIGS, rejected=_REMOVED_METRIC
    )
    kv_cache_usage_percentage_metric: str = _flag(
        _VLLM.kv_usage_spec, "str", _METRICS, _USE_ENGINE_CONFIGS, rejected=_REMOVED_METRIC
    )
    lora_info_metric: str = _flag(
        _VLLM.lora_spec, "str", _METRICS, _USE_ENGINE_CONFIGS, rejected=_REMOVED_METRIC
    )
    cache_info_metric: str = _flag(
        _VLLM.cache_info_spec, "str", _METRICS, _USE_ENGINE_CONFIGS, rejected=_REMOVED_METRIC
    )
    # observability
    metrics_port: int = _flag(
        9090, "int", _OBS, "The port of the Prometheus /metrics endpoint (and pprof).", check=_port
    )
    metrics_endpoint_auth: bool = _flag(
        True,
        "bool",
        _OBS,
        "Require a Kubernetes bearer token allowed to GET /metrics (TokenReview + SubjectAccessReview).",
    )
    enable_pprof: bool = _flag(
        True, "bool", _OBS, "Serve profiling handlers under /debug/pprof on the metrics port."
    )
    metrics_families: str = _flag(
        "gie,llm-d",
        "str",
        _OBS,
        "Metric names /metrics serves: gie (inference_objective_*, inference_pool_*, inference_extension_*), "
        "llm-d (llm-d-router's llm_d_epp_*), or both, comma-separated.",
        new=True,
        check=_families,
    )
    tracing: bool = _flag(
        True,
        "bool",
        _OBS,
        "Enables OpenTelemetry tracing; spans are exported only when OTEL_TRACES_EXPORTER is set.",
    )
    explain_request_header: str = _flag(  # docs/explain.md
        "",
        "str",
        _OBS,
        "A request carrying this header (any value but 0/false) gets every candidate's per-scorer scores "
        "in envoy.lb metadata and in the x-gateway-destination-endpoint-scores response header. Empty: off. "
        "The gateway must strip the header from untrusted clients (docs/explain.md).",
        new=True,
    )
    decisions_buffer_size: int = _flag(
        0,
        "int",
        _OBS,
        "Keep the last N routing decisions for /debug/decisions on the metrics port (0: off).",
        new=True,
    )
    # logging
    v: int = _flag(
        2, "int", _LOG, "Log verbosity: 2 info (default), 3 verbose, 4 debug, 5 trace.", shorthand="v"
    )
    log_format: str = _flag(
        "json", "str", _LOG, "Log line format: json or console.", new=True, check=_one_of("json", "console")
    )
    zap_devel: bool = _flag(True, "bool", _LOG, "Accepted for compatibility; has no effect.")
    zap_encoder: str = _flag(
        "",
        "str",
        _LOG,
        "Accepted for compatibility (json or console); use --log-format.",
        syntax=_zap_encoder,
    )
    zap_log_level: str = _flag(
        "",
        "str",
        _LOG,
        "Log level, overrides -v: debug, info, error, panic, or an integer > 0 meaning -v=N.",
        syntax=_zap_level,
    )
    zap_stacktrace_level: str = _flag(
        "",
        "str",
        _LOG,
        "Accepted for compatibility (info, error or panic); has no effect.",
        syntax=_zap_stacktrace,
    )
    zap_time_encoding: str = _flag(
        "",
        "str",
        _LOG,
        "Accepted for compatibility (epoch, millis, nanos, iso8601, rfc3339, rfc3339nano); has no effect.",
        syntax=_zap_time_encoding,
    )
    # cross-replica sync (epp.sync; docs/scale-out.md)
    peers: str = _flag(
        "",
        "str",
        _SYNC,
        "Active-active: the other EPP replicas' sync addresses, HOST:PORT[,HOST:PORT...] (their "
        "--peer-port); this replica's own address may be listed too and is skipped.",
        new=True,
        check=_peer_list,
    )
    peers_file: str = _flag(
        "",
        "str",
        _SYNC,
        "Active-active: a file of peer HOST:PORT entries, one a line (# comments), re-read when it changes.",
        new=True,
    )
    peer_port: int = _flag(
        9004,
        "int",
        _SYNC,
        "Port this replica receives peers' routing-state deltas and serves its warm-start snapshot on "
        "(with --peer-transport=zmq the snapshot is on the next port). 0 disables sync.",
        new=True,
        check=_in_range(0, 65534),
    )
    peer_transport: str = _flag(
        "h2",
        "str",
        _SYNC,
        "What carries the deltas: h2 (gRPC on the EPP's own HTTP/2 server, written from the event loop) "
        "or zmq (ZMQ PUB/SUB, written by libzmq's I/O thread). Every replica must use the same.",
        new=True,
        check=_one_of("h2", "zmq"),
    )
    peer_secret_file: str = _flag(
        "",
        "str",
        _SYNC,
        "Active-active: a file of shared secrets, one a line (# comments), re-read when it changes. A peer "
        "must present one of them (the first is what this replica presents) to publish deltas to it or "
        "to take its snapshot; rotate by adding the new secret everywhere, moving it first, then dropping "
        "the old. Empty: the peer port is unauthenticated (restrict it with a NetworkPolicy).",
        new=True,
    )
    peer_timeout: float = _flag(
        1.0,
        "duration",
        _SYNC,
        "A peer silent for this long has its in-flight contributions dropped until it is heard again.",
        new=True,
        check=_positive,
    )
    replica_id: str = _flag(
        "",
        "str",
        _SYNC,
        "This replica's identity in sync messages; empty means env POD_NAME, else HOSTNAME:PID.",
        new=True,
    )
    # derived, not flags
    explicit: frozenset[str] = frozenset()  # flag names given on the command line (Go's fs.Changed)
    endpoint_selector_labels: tuple[tuple[str, str], ...] = ()
    deployment_name: str = ""  # standalone mode: the EPP's Deployment, parsed from POD_NAME
    notices: tuple[str, ...] = field(default=(), compare=False)  # deprecation notes for the log

    @property
    def mode(self) -> Mode:
        """How endpoints are discovered; validation guarantees exactly one applies."""
        if self.pool_name:
            return "pool"
        if self.endpoint_selector:
            return "selector"
        if self.endpoints:
            return "endpoints"
        return "endpoints-file"

    @property
    def pool_label(self) -> str:
        """The pool's name as used in metrics labels and logs, whatever the mode."""
        return self.pool_name or self.deployment_name or STATIC_POOL_NAME

    @property
    def model_server_metrics(self) -> ModelServerMetricsFlags:
        """The deprecated ``--model-server-metrics-*`` values, as the config builder takes them."""
        return ModelServerMetricsFlags(**self._metrics_flag_values())

    def build_metrics_flags(self, factory: Callable[..., T]) -> T:
        """The same values handed to ``factory`` (keyword arguments named as the fields)."""
        return factory(**self._metrics_flag_values())

    def _metrics_flag_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            f.attr: getattr(self, f.flag.replace("-", "_")) for f in MODEL_SERVER_METRICS_FLAGS
        }
        values["explicitly_set"] = frozenset(
            f.attr for f in MODEL_SERVER_METRICS_FLAGS if f.flag in self.explicit
        )
        return values


FLAGS: Final[tuple[Flag, ...]] = tuple(
    Flag(name=f.name.replace("_", "-"), attr=f.name, **f.metadata[_SPEC])
    for f in dataclasses.fields(Options)
    if _SPEC in f.metadata
)
DEFAULTS: Final = Options()
DEPRECATED_METRIC_FLAGS: Final = tuple(f.name for f in FLAGS if f.rejected)
