"""Command-line flags: GIE's pflag surface, plus our no-Kubernetes flags, parsed into a frozen ``Options``."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from epp import pflag
from epp.datalayer.engines import builtin_engine
from epp.datalayer.sources.metrics_http import MODEL_SERVER_METRICS_FLAGS, ModelServerMetricsFlags
from epp.errors import ConfigError
from epp.metrics.llmd import parse_families
from epp.units import (
    format_go_duration,
    go_quote,
    parse_go_atoi,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
)

T = TypeVar("T")

Mode = Literal["pool", "selector", "endpoints", "endpoints-file"]

DEFAULT_POOL_NAMESPACE: Final = "default"
STATIC_POOL_NAME: Final = "epp"  # pool label in --endpoints/--endpoints-file mode when POD_NAME says nothing
MAX_TARGET_PORTS: Final = 8
DEPRECATED_METRIC_FLAGS: Final = (
    "total-queued-requests-metric",
    "total-running-requests-metric",
    "kv-cache-usage-percentage-metric",
    "lora-info-metric",
    "cache-info-metric",
)
# Declared once with the metrics-data-source parameters they stand for (datalayer/sources/metrics_http.py).
_METRICS_FLAG_ATTRS: Final = {f.flag: f.attr for f in MODEL_SERVER_METRICS_FLAGS}
_METRICS_DEFAULTS: Final = ModelServerMetricsFlags()
_VLLM: Final = builtin_engine("vllm")  # the deprecated --*-metric flags' defaults
_DISCOVERY_FLAGS: Final = ("pool-name", "endpoint-selector", "endpoints", "endpoints-file")
_DEPLOYMENT_FROM_POD: Final = re.compile(r"^(.+)-[a-z0-9]+-[a-z0-9]+$")


class HelpRequested(Exception):
    """``--help`` or ``-h`` was given: print ``text`` to stdout and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


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
class Options:
    """Every flag, by its flag name in snake_case; durations are float seconds."""

    # Envoy ext_proc server
    grpc_port: int = 9002
    bind_address: str = ""  # all interfaces, as GIE's ":<port>"
    secure_serving: bool = True
    cert_path: str = ""
    enable_cert_reload: bool = False
    health_checking: bool = False
    grpc_health_port: int = 9003
    ha_enable_leader_election: bool = False
    leader_election_lease_duration: float = 15.0
    leader_election_renew_deadline: float = 10.0
    leader_election_retry_period: float = 2.0
    max_request_body_bytes: int = 64 * 1024 * 1024
    shutdown_grace_period: float = 20.0
    shutdown_delay: float = 5.0
    ext_proc_transport: str = "h2"
    grpc_max_concurrent_streams: int = 1000
    grpc_max_message_bytes: int = 20 * 1024 * 1024
    grpc_keepalive_time: float = 7200.0
    grpc_keepalive_timeout: float = 20.0
    grpc_max_connection_idle: float = 3600.0
    # endpoint discovery
    pool_name: str = ""
    pool_namespace: str = ""
    pool_group: str = "inference.networking.k8s.io"
    kubeconfig: str = ""
    endpoint_selector: str = ""
    endpoint_target_ports: tuple[int, ...] = ()
    endpoints: tuple[HostPort, ...] = ()
    endpoints_file: str = ""
    objectives_file: str = ""
    disable_endpoint_subset_filter: bool = False
    emit_endpoint_scores: bool = False
    explain_request_header: str = ""  # docs/explain.md
    decisions_buffer_size: int = 0
    # configuration
    config_file: str = ""
    config_text: str = ""
    config_reload_interval: float = 0.25  # poll --config-file's content (0: only SIGHUP reloads)
    # model-server metrics
    model_server_metrics_scheme: str = _METRICS_DEFAULTS.scheme
    model_server_metrics_path: str = _METRICS_DEFAULTS.path
    model_server_metrics_port: int = _METRICS_DEFAULTS.port
    model_server_metrics_https_insecure_skip_verify: bool = _METRICS_DEFAULTS.insecure_skip_verify
    refresh_metrics_interval: float = 0.05
    refresh_prometheus_metrics_interval: float = 5.0
    metrics_staleness_threshold: float = 2.0
    total_queued_requests_metric: str = _VLLM.queued_requests_spec
    total_running_requests_metric: str = _VLLM.running_requests_spec
    kv_cache_usage_percentage_metric: str = _VLLM.kv_usage_spec
    lora_info_metric: str = _VLLM.lora_spec
    cache_info_metric: str = _VLLM.cache_info_spec
    # observability
    metrics_port: int = 9090
    metrics_endpoint_auth: bool = True
    enable_pprof: bool = True
    metrics_families: str = "gie,llm-d"
    tracing: bool = True
    # logging
    v: int = 2
    log_format: str = "json"
    zap_devel: bool = True
    zap_encoder: str = ""
    zap_log_level: str = ""
    zap_stacktrace_level: str = ""
    zap_time_encoding: str = ""
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


# --- controller-runtime zap flag values (parsed so typos fail; only the level is used) -------------

_ZAP_LEVELS: Final = frozenset({"debug", "info", "error", "panic"})
_ZAP_STACK_LEVELS: Final = frozenset({"info", "error", "panic"})
_ZAP_TIME_ENCODINGS: Final = frozenset({"rfc3339nano", "rfc3339", "iso8601", "millis", "nanos", "epoch"})


def _check_zap_encoder(s: str) -> None:
    if s.lower() not in ("json", "console"):
        raise ValueError(f"invalid encoder value {go_quote(s)}")


def _check_zap_level(s: str) -> None:
    if s.lower() in _ZAP_LEVELS:
        return
    try:
        n = parse_go_atoi(s)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"invalid log level {go_quote(s)}")


def _check_zap_stacktrace(s: str) -> None:
    if s.lower() not in _ZAP_STACK_LEVELS:
        raise ValueError(f"invalid stacktrace level {go_quote(s)}")


def _check_zap_time_encoding(s: str) -> None:
    if s.lower() not in _ZAP_TIME_ENCODINGS:
        raise ValueError(f"invalid time-encoding value {go_quote(s)}")


# --- the flag table --------------------------------------------------------------------------------

Kind = Literal["bool", "int", "str", "duration", "ints"]


@dataclass(frozen=True, slots=True)
class _Flag:
    name: str
    kind: Kind
    group: str
    help: str
    new: bool = False  # not a GIE flag
    shorthand: str = ""
    check: Callable[[str], None] | None = None

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    @property
    def display(self) -> str:
        return f"-{self.shorthand}, --{self.name}" if self.shorthand else f"--{self.name}"


_SERVER, _DISCOVERY, _CONFIG, _METRICS, _OBS, _LOG = (
    "Envoy ext_proc server",
    "Endpoint discovery (exactly one of --pool-name, --endpoint-selector, --endpoints, --endpoints-file)",
    "Configuration",
    "Model-server metrics",
    "Observability",
    "Logging",
)

FLAGS: Final[tuple[_Flag, ...]] = (
    _Flag("grpc-port", "int", _SERVER, "gRPC port used for communicating with Envoy proxy."),
    _Flag(
        "bind-address",
        "str",
        _SERVER,
        "IP address the ext_proc, health and metrics servers listen on; empty means all interfaces.",
        new=True,
    ),
    _Flag("secure-serving", "bool", _SERVER, "Enables secure serving (TLS on the ext_proc port)."),
    _Flag(
        "cert-path",
        "str",
        _SERVER,
        "Directory holding tls.crt and tls.key for secure serving; if empty and secure serving is "
        "enabled, a self-signed certificate is generated at startup.",
    ),
    _Flag(
        "enable-cert-reload", "bool", _SERVER, "Reload the certificate in --cert-path when its files change."
    ),
    _Flag(
        "health-checking",
        "bool",
        _SERVER,
        "Also serve the gRPC health service on the ext_proc port (reports SERVING).",
    ),
    _Flag("grpc-health-port", "int", _SERVER, "The port used for gRPC liveness and readiness probes."),
    _Flag(
        "ha-enable-leader-election",
        "bool",
        _SERVER,
        "Enables leader election for high availability; readiness passes only on the leader.",
    ),
    _Flag(
        "leader-election-lease-duration",
        "duration",
        _SERVER,
        "How long a leader's lease lasts without renewal before another replica may take it.",
        new=True,
    ),
    _Flag(
        "leader-election-renew-deadline",
        "duration",
        _SERVER,
        "How long the leader keeps trying to renew its lease before it stops acting as leader.",
        new=True,
    ),
    _Flag(
        "leader-election-retry-period",
        "duration",
        _SERVER,
        "How often candidates try to acquire, and the leader to renew, the lease.",
        new=True,
    ),
    _Flag(
        "max-request-body-bytes",
        "int",
        _SERVER,
        "Largest request body buffered for parsing; larger requests get 413. 0 means unlimited.",
        new=True,
    ),
    _Flag(
        "shutdown-delay",
        "duration",
        _SERVER,
        "On SIGTERM, keep accepting new streams (while health says NOT_SERVING) until none arrived for "
        "500ms, at most this long, so the proxy moves traffic away before the port closes.",
        new=True,
    ),
    _Flag(
        "shutdown-grace-period",
        "duration",
        _SERVER,
        "On SIGTERM, how long open streams may finish before the server stops.",
        new=True,
    ),
    _Flag(
        "ext-proc-transport",
        "str",
        _SERVER,
        "gRPC implementation serving ext_proc: h2 (the EPP's own HTTP/2 framing on the event loop) "
        "or grpcio (grpc.aio).",
        new=True,
    ),
    _Flag(
        "grpc-max-concurrent-streams",
        "int",
        _SERVER,
        "Streams one ext_proc client connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS); "
        "more are refused with REFUSED_STREAM and the proxy opens another connection.",
        new=True,
    ),
    _Flag(
        "grpc-max-message-bytes",
        "int",
        _SERVER,
        "Largest gRPC message received on the ext_proc port; a longer one ends its call with "
        "RESOURCE_EXHAUSTED. Must hold the largest body Envoy sends in one message (BUFFERED mode: "
        "its buffer limit).",
        new=True,
    ),
    _Flag(
        "grpc-keepalive-time",
        "duration",
        _SERVER,
        "After this long without reading anything from an ext_proc connection, PING it; 0 disables.",
        new=True,
    ),
    _Flag(
        "grpc-keepalive-timeout",
        "duration",
        _SERVER,
        "How long a keepalive PING may go unanswered before the connection is closed.",
        new=True,
    ),
    _Flag(
        "grpc-max-connection-idle",
        "duration",
        _SERVER,
        "Close (GOAWAY) an ext_proc connection that had no open stream for this long; 0 disables.",
        new=True,
    ),
    _Flag(
        "pool-name", "str", _DISCOVERY, "Name of the InferencePool this Endpoint Picker is associated with."
    ),
    _Flag(
        "pool-namespace",
        "str",
        _DISCOVERY,
        "Namespace of the InferencePool (and of the EPP in standalone mode); "
        "empty means env NAMESPACE, else 'default'.",
    ),
    _Flag("pool-group", "str", _DISCOVERY, "Kubernetes API group of the InferencePool."),
    _Flag(
        "kubeconfig",
        "str",
        _DISCOVERY,
        "Path to a kubeconfig; empty means $KUBECONFIG, then the in-cluster service account, "
        "then ~/.kube/config.",
    ),
    _Flag(
        "endpoint-selector",
        "str",
        _DISCOVERY,
        "Standalone mode: select model server pods by labels, 'key=value' pairs separated by commas "
        "(e.g. 'app=vllm-llama3-8b-instruct,env=prod'); needs env POD_NAME.",
    ),
    _Flag(
        "endpoint-target-ports",
        "ints",
        _DISCOVERY,
        "Standalone mode: target ports of model server pods, comma-separated (e.g. '3000,3001').",
    ),
    _Flag(
        "endpoints",
        "str",
        _DISCOVERY,
        "Without Kubernetes: a fixed list of model servers, HOST:PORT[,HOST:PORT...] ([::1]:8000 for IPv6).",
        new=True,
    ),
    _Flag(
        "endpoints-file",
        "str",
        _DISCOVERY,
        "Without Kubernetes: a YAML file listing model servers.",
        new=True,
    ),
    _Flag(
        "objectives-file",
        "str",
        _DISCOVERY,
        "Without an InferencePool: a YAML file of InferenceObjective and InferenceModelRewrite objects.",
        new=True,
    ),
    _Flag(
        "emit-endpoint-scores",
        "bool",
        _DISCOVERY,
        "Add every candidate's final scheduler score to the routing reply's envoy.lb dynamic metadata "
        "under 'x-gateway-destination-endpoint-scores' (llm-d-router's flag), and each scorer's weighted "
        "score under 'x-gateway-destination-endpoint-score-breakdown'.",
    ),
    _Flag(
        "explain-request-header",
        "str",
        _OBS,
        "A request carrying this header (any value but 0/false) gets every candidate's per-scorer scores "
        "in envoy.lb metadata and in the x-gateway-destination-endpoint-scores response header. Empty: off. "
        "The gateway must strip the header from untrusted clients (docs/explain.md).",
        new=True,
    ),
    _Flag(
        "decisions-buffer-size",
        "int",
        _OBS,
        "Keep the last N routing decisions for /debug/decisions on the metrics port (0: off).",
        new=True,
    ),
    _Flag(
        "disable-endpoint-subset-filter",
        "bool",
        _DISCOVERY,
        "Ignore the x-gateway-destination-endpoint-subset hint sent by the proxy.",
    ),
    _Flag("config-file", "str", _CONFIG, "The path to the EndpointPickerConfig file."),
    _Flag("config-text", "str", _CONFIG, "The EndpointPickerConfig as text, in lieu of a file."),
    _Flag(
        "config-reload-interval",
        "duration",
        _CONFIG,
        "How often --config-file's content is checked for a change to apply live (0: on SIGHUP only).",
        new=True,
    ),
    *(_Flag(f.flag, f.kind, _METRICS, f.help) for f in MODEL_SERVER_METRICS_FLAGS),
    _Flag("refresh-metrics-interval", "duration", _METRICS, "Interval to refresh metrics of each endpoint."),
    _Flag(
        "refresh-prometheus-metrics-interval",
        "duration",
        _METRICS,
        "Interval to recompute the inference_pool_* gauges.",
    ),
    _Flag(
        "metrics-staleness-threshold",
        "duration",
        _METRICS,
        "Endpoint metrics older than this are left out of the pool gauges.",
    ),
    _Flag("total-queued-requests-metric", "str", _METRICS, "Rejected if set: use engineConfigs."),
    _Flag("total-running-requests-metric", "str", _METRICS, "Rejected if set: use engineConfigs."),
    _Flag("kv-cache-usage-percentage-metric", "str", _METRICS, "Rejected if set: use engineConfigs."),
    _Flag("lora-info-metric", "str", _METRICS, "Rejected if set: use engineConfigs."),
    _Flag("cache-info-metric", "str", _METRICS, "Rejected if set: use engineConfigs."),
    _Flag("metrics-port", "int", _OBS, "The port of the Prometheus /metrics endpoint (and pprof)."),
    _Flag(
        "metrics-endpoint-auth",
        "bool",
        _OBS,
        "Require a Kubernetes bearer token allowed to GET /metrics (TokenReview + SubjectAccessReview).",
    ),
    _Flag("enable-pprof", "bool", _OBS, "Serve profiling handlers under /debug/pprof on the metrics port."),
    _Flag(
        "metrics-families",
        "str",
        _OBS,
        "Metric names /metrics serves: gie (inference_objective_*, inference_pool_*, inference_extension_*), "
        "llm-d (llm-d-router's llm_d_epp_*), or both, comma-separated.",
        new=True,
    ),
    _Flag(
        "tracing",
        "bool",
        _OBS,
        "Enables OpenTelemetry tracing; spans are exported only when OTEL_TRACES_EXPORTER is set.",
    ),
    _Flag("v", "int", _LOG, "Log verbosity: 2 info (default), 3 verbose, 4 debug, 5 trace.", shorthand="v"),
    _Flag("log-format", "str", _LOG, "Log line format: json or console.", new=True),
    _Flag("zap-devel", "bool", _LOG, "Accepted for compatibility; has no effect."),
    _Flag(
        "zap-encoder",
        "str",
        _LOG,
        "Accepted for compatibility (json or console); use --log-format.",
        check=_check_zap_encoder,
    ),
    _Flag(
        "zap-log-level",
        "str",
        _LOG,
        "Log level, overrides -v: debug, info, error, panic, or an integer > 0 meaning -v=N.",
        check=_check_zap_level,
    ),
    _Flag(
        "zap-stacktrace-level",
        "str",
        _LOG,
        "Accepted for compatibility (info, error or panic); has no effect.",
        check=_check_zap_stacktrace,
    ),
    _Flag(
        "zap-time-encoding",
        "str",
        _LOG,
        "Accepted for compatibility (epoch, millis, nanos, iso8601, rfc3339, rfc3339nano); has no effect.",
        check=_check_zap_time_encoding,
    ),
)
_BY_NAME: Final = {f.name: f for f in FLAGS}
_IS_BOOL: Final = {f.name: f.kind == "bool" for f in FLAGS}
_SHORTHANDS: Final = {f.shorthand: f.name for f in FLAGS if f.shorthand}
DEFAULTS: Final = Options()


def _convert(flag: _Flag, raw: str, previous: object) -> object:
    """One flag value, or a pflag-worded error naming the flag and the value."""
    try:
        match flag.kind:
            case "bool":
                return parse_go_bool(raw)
            case "int":
                return parse_go_int(raw)
            case "duration":
                return parse_go_duration(raw)
            case "ints":
                parsed = tuple(parse_go_atoi(p) for p in raw.split(","))
                return (previous if isinstance(previous, tuple) else ()) + parsed
            case "str":
                if flag.check is not None:
                    flag.check(raw)
                return raw
    except ValueError as e:
        raise ConfigError(
            f"invalid argument {go_quote(raw)} for {go_quote(flag.display)} flag: {e}"
        ) from None
    raise AssertionError(flag.kind)  # pragma: no cover - Kind is exhaustive


def parse_flags(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Parse ``argv`` (without the program name) and the environment into validated ``Options``.

    Raises ``ConfigError`` with GIE's message for any invalid flag or combination, and
    ``HelpRequested`` for ``--help``.  The command-line syntax is pflag's (``epp.pflag``).
    """
    values: dict[str, Any] = {}
    explicit: dict[str, None] = {}  # ordered set
    try:
        for name, value in pflag.scan(argv, _IS_BOOL, _SHORTHANDS):
            flag = _BY_NAME[name]
            values[flag.attr] = _convert(flag, value, values.get(flag.attr))
            explicit[flag.name] = None
    except pflag.HelpFlag:
        raise HelpRequested(usage()) from None
    except pflag.FlagSyntaxError as e:
        raise ConfigError(str(e)) from None
    except pflag.PositionalArgument as e:
        hint = ""
        if e.after_bool is not None:
            hint = f" (boolean flags take their value inline: {e.after_bool}={e.argument})"
        raise ConfigError(
            f"unexpected argument {go_quote(e.argument)}: the epp takes flags only{hint}"
        ) from None
    raw_endpoints = values.pop("endpoints", "")
    opts: Options = dataclasses.replace(DEFAULTS, **values, explicit=frozenset(explicit))
    return _complete(opts, raw_endpoints if isinstance(raw_endpoints, str) else "", env)


# --- completion and validation (GIE's Options.Complete + Validate + runner checks) ----------------


def _complete(opts: Options, raw_endpoints: str, env: Mapping[str, str]) -> Options:
    ports = tuple(dict.fromkeys(opts.endpoint_target_ports))
    namespace = opts.pool_namespace or env.get("NAMESPACE", "") or DEFAULT_POOL_NAMESPACE
    opts = dataclasses.replace(opts, endpoint_target_ports=ports, pool_namespace=namespace)
    _validate_discovery(opts, raw_endpoints)
    if opts.config_text and opts.config_file:
        raise ConfigError('both the "configText" and "configFile" flags can not be set at the same time')
    if opts.model_server_metrics_scheme not in ("http", "https"):
        raise ConfigError(
            f"unexpected {go_quote(opts.model_server_metrics_scheme)} value for "
            "\"model-server-metrics-scheme\" flag, it can only be set to 'http' or 'https'"
        )
    for name in DEPRECATED_METRIC_FLAGS:
        if name in opts.explicit:
            raise ConfigError(
                f"flag {go_quote(name)} is deprecated and cannot be used; "
                "configure metrics via engineConfigs in EndpointPickerConfig instead"
            )
    _validate_new(opts)
    endpoints = _parse_endpoints(raw_endpoints) if raw_endpoints else ()
    labels: tuple[tuple[str, str], ...] = ()
    deployment = ""
    if opts.endpoint_selector:
        labels = parse_selector(opts.endpoint_selector)
        pod = env.get("POD_NAME")
        if not pod:
            raise ConfigError("failed to get environment variable POD_NAME")
        deployment = deployment_from_pod_name(pod)
    elif not opts.pool_name:
        pod = env.get("POD_NAME", "")
        m = _DEPLOYMENT_FROM_POD.match(pod)
        deployment = m.group(1) if m else ""
    return dataclasses.replace(
        opts,
        endpoints=endpoints,
        endpoint_selector_labels=labels,
        deployment_name=deployment,
        notices=_notices(opts),
    )


def _validate_discovery(opts: Options, raw_endpoints: str) -> None:
    given = [
        name
        for name, value in zip(
            _DISCOVERY_FLAGS,
            (opts.pool_name, opts.endpoint_selector, raw_endpoints, opts.endpoints_file),
            strict=True,
        )
        if value
    ]
    if not given:
        raise ConfigError(
            "either pool-name or endpoint-selector must be set "
            "(or, without Kubernetes, endpoints or endpoints-file)"
        )
    if len(given) > 1:
        if set(given) == {"pool-name", "endpoint-selector"}:
            raise ConfigError("either pool-name or endpoint-selector must be set")
        quoted = [go_quote(n) for n in given]
        listed = ", ".join(quoted[:-1]) + " and " + quoted[-1]
        raise ConfigError(f"flags {listed} cannot be set at the same time; choose one way to find endpoints")
    if opts.endpoint_selector:
        if not 1 <= len(opts.endpoint_target_ports) <= MAX_TARGET_PORTS:
            raise ConfigError('flag "endpoint-target-ports" should have length from 1 to 8')
        for port in opts.endpoint_target_ports:
            if not 0 <= port <= 65535:
                raise ConfigError(f'invalid port number {port} in "endpoint-target-ports"')


def _validate_new(opts: Options) -> None:
    """Checks GIE lacks: our own flags, and ports that could never be bound."""
    for name in ("grpc-port", "grpc-health-port", "metrics-port"):
        port = getattr(opts, name.replace("-", "_"))
        if not 0 <= port <= 65535:
            raise ConfigError(f"invalid port number {port} in {go_quote(name)}")
    if opts.bind_address:
        try:
            ipaddress.ip_address(opts.bind_address.removeprefix("[").removesuffix("]"))
        except ValueError:
            raise ConfigError(
                f'invalid value {go_quote(opts.bind_address)} for "bind-address": not an IP address'
            ) from None
    if opts.ext_proc_transport not in ("h2", "grpcio"):
        raise ConfigError(
            f'unexpected {go_quote(opts.ext_proc_transport)} value for "ext-proc-transport" flag, '
            "it can only be set to 'h2' or 'grpcio'"
        )
    try:
        parse_families(opts.metrics_families)
    except ValueError as e:
        raise ConfigError(
            f'invalid value {go_quote(opts.metrics_families)} for "metrics-families": {e}'
        ) from None
    if opts.log_format not in ("json", "console"):
        raise ConfigError(
            f'unexpected {go_quote(opts.log_format)} value for "log-format" flag, '
            "it can only be set to 'json' or 'console'"
        )
    if opts.max_request_body_bytes < 0:
        raise ConfigError(
            f'invalid value {opts.max_request_body_bytes} for "max-request-body-bytes": '
            "must be >= 0 (0 means unlimited)"
        )
    if opts.grpc_max_concurrent_streams < 1 or opts.grpc_max_concurrent_streams > 0x7FFFFFFF:
        raise ConfigError(
            f'invalid value {opts.grpc_max_concurrent_streams} for "grpc-max-concurrent-streams": '
            "must be in [1, 2147483647]"
        )
    if opts.grpc_max_message_bytes < 1 or opts.grpc_max_message_bytes > 0x7FFFFFFF - 5:
        raise ConfigError(
            f'invalid value {opts.grpc_max_message_bytes} for "grpc-max-message-bytes": '
            "must be in [1, 2147483642]"
        )
    for name in (
        "grpc-keepalive-time",
        "grpc-keepalive-timeout",
        "grpc-max-connection-idle",
        "config-reload-interval",
    ):
        value = getattr(opts, name.replace("-", "_"))
        if value < 0:
            raise ConfigError(
                f"invalid value {go_quote(format_go_duration(value))} for {go_quote(name)}: "
                "must not be negative"
            )
    if opts.shutdown_grace_period < 0:
        raise ConfigError(
            f"invalid value {go_quote(format_go_duration(opts.shutdown_grace_period))} "
            'for "shutdown-grace-period": must not be negative'
        )
    if opts.shutdown_delay < 0:
        raise ConfigError(
            f"invalid value {go_quote(format_go_duration(opts.shutdown_delay))} "
            'for "shutdown-delay": must not be negative'
        )
    if opts.ha_enable_leader_election and not (opts.pool_name or opts.endpoint_selector):
        raise ConfigError(
            'flag "ha-enable-leader-election" needs Kubernetes: set "pool-name" or "endpoint-selector" '
            "(the lease lives in the API server)"
        )
    lease, renew, retry = (
        opts.leader_election_lease_duration,
        opts.leader_election_renew_deadline,
        opts.leader_election_retry_period,
    )
    if not lease > renew > 1.2 * retry > 0:
        raise ConfigError(
            '"leader-election-lease-duration" > "leader-election-renew-deadline" > '
            f'1.2 x "leader-election-retry-period" > 0 is required, got {format_go_duration(lease)}, '
            f"{format_go_duration(renew)} and {format_go_duration(retry)}"
        )
    if opts.objectives_file and opts.pool_name:
        raise ConfigError(
            'flag "objectives-file" cannot be used with "pool-name": in InferencePool mode objectives '
            "and rewrites come from the InferenceObjective and InferenceModelRewrite resources"
        )


def _notices(opts: Options) -> tuple[str, ...]:
    out = [
        f"flag {go_quote(name)} is deprecated and will be removed; "
        "set the metrics-data-source plugin parameters in EndpointPickerConfig instead"
        for name in _METRICS_FLAG_ATTRS
        if name in opts.explicit
    ]
    if opts.enable_cert_reload and not opts.cert_path:
        out.append('flag "enable-cert-reload" has no effect without "cert-path"')
    return tuple(out)


def deployment_from_pod_name(pod: str) -> str:
    """GIE's standalone-mode EPP name: the Deployment that owns pod ``<deploy>-<hash>-<id>``."""
    m = _DEPLOYMENT_FROM_POD.match(pod)
    if m is None:
        raise ConfigError(f"failed to parse deployment name from pod name {pod}")
    return m.group(1)


_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)


def parse_selector(selector: str) -> tuple[tuple[str, str], ...]:
    """Kubernetes' ``labels.ConvertSelectorToLabelsMap``: ``k=v,k2=v2`` with label syntax checks."""

    def fail(detail: str) -> ConfigError:
        return ConfigError(f"failed to parse endpoint selector {go_quote(selector)}: {detail}")

    out: dict[str, str] = {}
    for part in selector.split(","):
        kv = part.split("=")
        if len(kv) != 2:
            raise fail(f"invalid selector: [{' '.join(kv)}]")
        key, value = kv[0].strip(), kv[1].strip()
        prefix, slash, name = key.rpartition("/")
        if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
            raise fail(f"invalid label key {go_quote(key)}: prefix part must be a lowercase DNS subdomain")
        if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
            raise fail(f"invalid label key {go_quote(key)}: name part {_NAME_RULE} (at most 63 characters)")
        if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
            raise fail(
                f"invalid label value {go_quote(value)}: a label value {_NAME_RULE} (at most 63 characters)"
            )
        out[key] = value
    return tuple(out.items())


_HOSTNAME: Final = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*\.?"
)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def parse_endpoint(entry: str) -> HostPort:
    """One ``HOST:PORT`` (``[v6]:PORT``); ValueError says what is wrong with it."""
    if not entry:
        raise ValueError("empty entry")
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep:
            raise ValueError("missing ']' after an IPv6 address")
        if not rest.startswith(":"):
            raise ValueError("missing port")
        port_text = rest[1:]
        if not _is_ipv6(host):
            raise ValueError(f"{go_quote(host)} in brackets is not an IPv6 address")
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep:
            raise ValueError("missing port")
        if ":" in host:
            raise ValueError("an IPv6 address must be in brackets, e.g. [::1]:8000")
        if not host:
            raise ValueError("missing host")
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{go_quote(host)} is neither an IP address nor a DNS name")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {go_quote(port_text)} is not a number from 1 to 65535")
    return HostPort(host, int(port_text))


def _parse_endpoints(raw: str) -> tuple[HostPort, ...]:
    out: dict[HostPort, None] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        try:
            out[parse_endpoint(entry)] = None
        except ValueError as e:
            raise ConfigError(f'invalid endpoint {go_quote(entry)} in "endpoints": {e}') from None
    return tuple(out)


# --- --help ----------------------------------------------------------------------------------------

_TYPE_NAMES: Final = {"bool": "", "int": "int", "str": "string", "duration": "duration", "ints": "ints"}


def _default_text(flag: _Flag) -> str:
    value = getattr(DEFAULTS, flag.attr)
    match flag.kind:
        case "bool":
            return "true" if value else "false"
        case "duration":
            return format_go_duration(float(value))
        case "ints":
            return "[" + ",".join(str(p) for p in value) + "]"
        case "str":
            return go_quote(str(value)) if flag.name != "endpoints" else '""'
        case _:
            return str(value)


def usage() -> str:
    """The ``--help`` text: every flag, grouped, with its default; ``[new]`` marks flags GIE lacks."""
    lines = [
        "Usage: epp [flags]",
        "       epp explain --help   (replay one request offline and print its decision, docs/explain.md)",
        "",
        "A Python Endpoint Picker for the Gateway API Inference Extension.",
    ]
    group = ""
    for f in FLAGS:
        if f.group != group:
            group = f.group
            lines += ["", f"{group}:"]
        lines.append(f"  {f.display} {_TYPE_NAMES[f.kind]}".rstrip())
        tag = " [new]" if f.new else ""
        text = f"{f.help}{tag} (default {_default_text(f)})"
        lines += textwrap.wrap(text, width=100, initial_indent=" " * 8, subsequent_indent=" " * 8)
    lines += [
        "",
        "Environment: NAMESPACE (pool namespace fallback), POD_NAME (standalone mode), OTEL_TRACES_EXPORTER,",
        "OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG.",
    ]
    return "\n".join(lines) + "\n"
