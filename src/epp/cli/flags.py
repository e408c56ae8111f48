"""The command line: GIE's pflag surface, plus our no-Kubernetes flags, parsed into a frozen ``Options``.

The flags themselves are declared once, as the fields of ``Options`` (``app/options.py``);
this module reads argv with pflag's syntax (``epp.pflag``), converts each value by its
flag's type, runs each flag's checks, then what only the whole command line can check
(GIE's ``Options.Complete`` + ``Validate`` and the runner's checks), and prints ``--help``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Final

from epp import pflag
from epp.app.options import DEFAULTS, DEPRECATED_METRIC_FLAGS, FLAGS, Flag, HostPort, Mode, Options
from epp.config.load import load
from epp.datalayer.sources.metrics_http import MODEL_SERVER_METRICS_FLAGS
from epp.errors import ConfigError
from epp.units import (
    format_go_duration,
    go_quote,
    parse_go_atoi,
    parse_go_bool,
    parse_go_duration,
    parse_go_int,
)

__all__ = [
    "DEFAULTS",
    "DEPRECATED_METRIC_FLAGS",
    "FLAGS",
    "Flag",
    "HelpRequested",
    "HostPort",
    "Mode",
    "Options",
    "default_text",
    "deployment_from_pod_name",
    "parse_endpoint",
    "parse_flags",
    "parse_selector",
    "usage",
]

DEFAULT_POOL_NAMESPACE: Final = "default"
MAX_TARGET_PORTS: Final = 8
_METRICS_FLAG_NAMES: Final = tuple(f.flag for f in MODEL_SERVER_METRICS_FLAGS)  # deprecated: a notice each
_DISCOVERY_FLAGS: Final = ("pool-name", "endpoint-selector", "endpoints", "endpoints-file")
_DEPLOYMENT_FROM_POD: Final = re.compile(r"^(.+)-[a-z0-9]+-[a-z0-9]+$")
_BY_NAME: Final = {f.name: f for f in FLAGS}
_IS_BOOL: Final = {f.name: f.kind == "bool" for f in FLAGS}
_SHORTHANDS: Final = {f.shorthand: f.name for f in FLAGS if f.shorthand}


class HelpRequested(Exception):
    """``--help`` or ``-h`` was given: print ``text`` to stdout and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


def _convert(flag: Flag, raw: str, previous: object) -> object:
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
            case "str" | "hostports":  # host ports are parsed once discovery is validated
                if flag.syntax is not None:
                    flag.syntax(raw)
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
    for flag in FLAGS:
        if flag.rejected and flag.name in opts.explicit:
            raise ConfigError(f"flag {go_quote(flag.name)} is deprecated and cannot be used; {flag.rejected}")
        if flag.check is not None:
            flag.check(flag.name, getattr(opts, flag.attr))
    _validate_combinations(opts)
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


def _config_discovers(opts: Options) -> bool:
    """Whether the config names a discovery plugin; a config that does not load says so later."""
    if not (opts.config_file or opts.config_text) or (opts.config_file and opts.config_text):
        return False
    try:
        config = load(config_file=opts.config_file, config_text=opts.config_text)
    except ConfigError:
        return False
    return config.data_layer is not None and config.data_layer.discovery is not None


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
    if _config_discovers(opts):  # llm-d-router's dataLayer.discovery (file-discovery) finds them
        if given:
            raise ConfigError(
                f"flag {go_quote(given[0])} and the config's dataLayer.discovery cannot both find "
                "endpoints; choose one"
            )
        return
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


def _validate_combinations(opts: Options) -> None:
    """Checks GIE lacks that involve more than one flag (each flag's own checks are declared with it)."""
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
        for name in _METRICS_FLAG_NAMES
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

_TYPE_NAMES: Final = {
    "bool": "",
    "int": "int",
    "str": "string",
    "duration": "duration",
    "ints": "ints",
    "hostports": "string",
}


def default_text(flag: Flag) -> str:
    """A flag's default as ``--help`` and docs/flags.md show it (Go's formatting)."""
    value = getattr(DEFAULTS, flag.attr)
    match flag.kind:
        case "bool":
            return "true" if value else "false"
        case "duration":
            return format_go_duration(float(value))
        case "ints":
            return "[" + ",".join(str(p) for p in value) + "]"
        case "str":
            return go_quote(str(value))
        case "hostports":
            return go_quote(",".join(str(hp) for hp in value))
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
        text = f"{f.help}{tag} (default {default_text(f)})"
        lines += textwrap.wrap(text, width=100, initial_indent=" " * 8, subsequent_indent=" " * 8)
    lines += [
        "",
        "Environment: NAMESPACE (pool namespace fallback), POD_NAME (standalone mode), OTEL_TRACES_EXPORTER,",
        "OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG.",
    ]
    return "\n".join(lines) + "\n"
