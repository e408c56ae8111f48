"""Flag parsing: GIE's names, defaults, Go value syntax and validation messages, plus our own flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from epp.cli.flags import (
    DEPRECATED_METRIC_FLAGS,
    FLAGS,
    HelpRequested,
    HostPort,
    parse_flags,
)
from epp.datalayer.sources.metrics_http import ModelServerMetricsFlags
from epp.errors import ConfigError
from epp.units import format_go_duration, parse_go_duration, parse_go_int

POOL = ["--pool-name=pool"]

# GIE's defaults (§1.1), written out rather than read back from the code under test.
GIE_DEFAULTS: dict[str, Any] = {
    "grpc-port": 9002,
    "ha-enable-leader-election": False,
    "pool-group": "inference.networking.k8s.io",
    "pool-name": "",
    "endpoint-selector": "",
    "endpoint-target-ports": (),
    "disable-endpoint-subset-filter": False,
    "model-server-metrics-scheme": "http",
    "model-server-metrics-path": "/metrics",
    "model-server-metrics-port": 0,
    "model-server-metrics-https-insecure-skip-verify": True,
    "refresh-metrics-interval": 0.05,
    "refresh-prometheus-metrics-interval": 5.0,
    "metrics-staleness-threshold": 2.0,
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
    "v": 2,
    "zap-devel": True,
    "zap-encoder": "",
    "zap-log-level": "",
    "zap-stacktrace-level": "",
    "zap-time-encoding": "",
    "tracing": True,
    "health-checking": False,
    "metrics-port": 9090,
    "grpc-health-port": 9003,
    "enable-pprof": True,
    "cert-path": "",
    "enable-cert-reload": False,
    "secure-serving": True,
    "metrics-endpoint-auth": True,
    "config-file": "",
    "config-text": "",
    "kubeconfig": "",  # controller-runtime's, registered in GIE's binary too
    "emit-endpoint-scores": False,  # llm-d-router's
    "explain-request-header": "",  # ours (docs/explain.md)
    "decisions-buffer-size": 0,  # ours
    # ours
    "endpoints": (),
    "endpoints-file": "",
    "objectives-file": "",
    "max-request-body-bytes": 67108864,
    "shutdown-grace-period": 20.0,
    "shutdown-delay": 5.0,
    "ext-proc-transport": "h2",
    "grpc-max-concurrent-streams": 1000,
    "grpc-max-message-bytes": 20971520,
    "grpc-keepalive-time": 7200.0,
    "grpc-keepalive-timeout": 20.0,
    "grpc-max-connection-idle": 3600.0,
    "workers": 0,  # ours: --workers N, 0 = the cores the pod may use (docs/workers.md)
    "log-format": "json",
    "metrics-families": "gie,llm-d",
    "config-reload-interval": 0.25,  # ours: live config reload
    "bind-address": "",
    "leader-election-lease-duration": 15.0,
    "leader-election-renew-deadline": 10.0,
    "leader-election-retry-period": 2.0,
    # ours: cross-replica sync (docs/scale-out.md)
    "peers": "",
    "peers-file": "",
    "peer-port": 9004,
    "peer-timeout": 1.0,
    "peer-transport": "h2",
    "peer-secret-file": "",
    "replica-id": "",
}


def attr(flag: str) -> str:
    return flag.replace("-", "_")


def test_flag_table_is_complete() -> None:
    """Every flag of GIE §1.1 plus ours is defined, and nothing else (pool-namespace is checked apart)."""
    assert {f.name for f in FLAGS} == set(GIE_DEFAULTS) | {"pool-namespace"}


@pytest.mark.parametrize(("flag", "expected"), [pytest.param(k, v, id=k) for k, v in GIE_DEFAULTS.items()])
def test_defaults(flag: str, expected: object) -> None:
    """A flag not given has GIE's default (pool-name aside, which the minimal argv sets)."""
    argv = ["--endpoints-file=eps.yaml"] if flag == "pool-name" else POOL
    opts = parse_flags(argv, {})
    assert getattr(opts, attr(flag)) == expected
    assert flag not in opts.explicit or flag == "pool-name"


@pytest.mark.parametrize(
    ("argv", "field", "expected"),
    [
        pytest.param(["--grpc-port=9100"], "grpc_port", 9100, id="long-equals"),
        pytest.param(["--grpc-port", "9100"], "grpc_port", 9100, id="long-space"),
        pytest.param(["-grpc-port=9100"], "grpc_port", 9100, id="single-dash-long"),
        pytest.param(["--grpc-port=0x2390"], "grpc_port", 9104, id="int-hex"),
        pytest.param(["--grpc-port=010"], "grpc_port", 8, id="int-leading-zero-octal"),
        pytest.param(["--grpc-port=9_100"], "grpc_port", 9100, id="int-underscore"),
        pytest.param(["--grpc-port=+9100"], "grpc_port", 9100, id="int-plus"),
        pytest.param(["-v=4"], "v", 4, id="v-short-equals"),
        pytest.param(["-v", "4"], "v", 4, id="v-short-space"),
        pytest.param(["-v4"], "v", 4, id="v-short-glued"),
        pytest.param(["--v=5"], "v", 5, id="v-long-equals"),
        pytest.param(["--v", "3"], "v", 3, id="v-long-space"),
        pytest.param(["-v", "-1"], "v", -1, id="v-negative-takes-next-arg"),
        pytest.param(["--tracing=false"], "tracing", False, id="bool-false"),
        pytest.param(["--tracing=F"], "tracing", False, id="bool-go-F"),
        pytest.param(["--tracing=0"], "tracing", False, id="bool-go-0"),
        pytest.param(["--health-checking"], "health_checking", True, id="bool-bare"),
        pytest.param(["--health-checking=TRUE"], "health_checking", True, id="bool-go-TRUE"),
        pytest.param(["--grpc-port=1", "--grpc-port=2"], "grpc_port", 2, id="last-wins"),
        pytest.param(["--refresh-metrics-interval=1m30s"], "refresh_metrics_interval", 90.0, id="duration"),
        pytest.param(["--config-text", "a: b"], "config_text", "a: b", id="string-with-space"),
        pytest.param(["--config-file="], "config_file", "", id="string-empty"),
        pytest.param(["--pool-group", "--x"], "pool_group", "--x", id="string-takes-dash-value"),
        pytest.param(["--bind-address=127.0.0.1"], "bind_address", "127.0.0.1", id="bind-v4"),
        pytest.param(["--bind-address=::1"], "bind_address", "::1", id="bind-v6"),
    ],
)
def test_go_style_forms(argv: list[str], field: str, expected: object) -> None:
    """pflag's syntaxes all parse: --f=v, --f v, -v N, -vN, bare bools, Go ints and Go bools."""
    assert getattr(parse_flags([*POOL, *argv], {}), field) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("50ms", 0.05, id="ms"),
        pytest.param("2s", 2.0, id="s"),
        pytest.param("1m30s", 90.0, id="m-s"),
        pytest.param("1.5h", 5400.0, id="fractional-h"),
        pytest.param("1h2m3.5s", 3723.5, id="h-m-fractional-s"),
        pytest.param(".5s", 0.5, id="leading-dot"),
        pytest.param("5.s", 5.0, id="trailing-dot"),
        pytest.param("-2s", -2.0, id="negative"),
        pytest.param("+2s", 2.0, id="plus"),
        pytest.param("0", 0.0, id="bare-zero"),
        pytest.param("300us", 0.0003, id="us"),
        pytest.param("300µs", 0.0003, id="micro-sign"),
        pytest.param("300μs", 0.0003, id="greek-mu"),
        pytest.param("1500ns", 0.0000015, id="ns"),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    """Go's time.ParseDuration syntax, as float seconds."""
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("5", 'time: missing unit in duration "5"', id="no-unit"),
        pytest.param("5x", 'time: unknown unit "x" in duration "5x"', id="unknown-unit"),
        pytest.param("", 'time: invalid duration ""', id="empty"),
        pytest.param("s", 'time: invalid duration "s"', id="unit-only"),
        pytest.param("-", 'time: invalid duration "-"', id="sign-only"),
        pytest.param("1.2.3s", 'time: missing unit in duration "1.2.3s"', id="two-dots"),
        pytest.param("3000000h", 'time: invalid duration "3000000h"', id="overflow"),
    ],
)
def test_go_duration_errors(text: str, message: str) -> None:
    """Bad durations fail with Go's wording."""
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(") + "$"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0.05, "50ms", id="ms"),
        pytest.param(5.0, "5s", id="s"),
        pytest.param(90.0, "1m30s", id="m-s"),
        pytest.param(3723.5, "1h2m3.5s", id="h-m-s"),
        pytest.param(0.0, "0s", id="zero"),
    ],
)
def test_format_go_duration(seconds: float, text: str) -> None:
    """--help prints durations the way Go's Duration.String does."""
    assert format_go_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("9x", 'strconv.ParseInt: parsing "9x": invalid syntax', id="junk"),
        pytest.param("08", 'strconv.ParseInt: parsing "08": invalid syntax', id="bad-octal"),
        pytest.param("1__0", 'strconv.ParseInt: parsing "1__0": invalid syntax', id="double-underscore"),
        pytest.param("", 'strconv.ParseInt: parsing "": invalid syntax', id="empty"),
        pytest.param("9223372036854775808", "value out of range", id="overflow"),
    ],
)
def test_go_int_errors(text: str, message: str) -> None:
    """Bad ints fail the way strconv.ParseInt(s, 0, 64) does."""
    with pytest.raises(ValueError, match=message):
        parse_go_int(text)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["--endpoint-target-ports=3000,3001"], (3000, 3001), id="list"),
        pytest.param(["--endpoint-target-ports", "3000"], (3000,), id="single"),
        pytest.param(["--endpoint-target-ports=3000,3001,3000"], (3000, 3001), id="dedup-keeps-order"),
        pytest.param(
            ["--endpoint-target-ports=3000", "--endpoint-target-ports=3001,3002"],
            (3000, 3001, 3002),
            id="repeated-appends",
        ),
        pytest.param(["--endpoint-target-ports=0"], (0,), id="zero-accepted"),
    ],
)
def test_int_slices(argv: list[str], expected: tuple[int, ...]) -> None:
    """Int slices split on commas, append when repeated and are de-duplicated in first-seen order."""
    opts = parse_flags(["--endpoint-selector=app=x", *argv], {"POD_NAME": "epp-5d8f9c7b6-x2x9z"})
    assert opts.endpoint_target_ports == expected


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        pytest.param("3000,x", 'strconv.Atoi: parsing "x": invalid syntax', id="junk"),
        pytest.param("", 'strconv.Atoi: parsing "": invalid syntax', id="empty"),
        pytest.param("3000, 3001", 'strconv.Atoi: parsing " 3001": invalid syntax', id="space"),
        pytest.param("3_000", 'strconv.Atoi: parsing "3_000": invalid syntax', id="underscore"),
        pytest.param("0x10", 'strconv.Atoi: parsing "0x10": invalid syntax', id="hex"),
    ],
)
def test_int_slice_errors(value: str, detail: str) -> None:
    """Int-slice elements are base-10 strconv.Atoi; errors come wrapped the way pflag wraps them."""
    with pytest.raises(ConfigError) as err:
        parse_flags([*POOL, f"--endpoint-target-ports={value}"], {})
    assert str(err.value) == f'invalid argument "{value}" for "--endpoint-target-ports" flag: {detail}'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--grpc-port=abc"],
            'invalid argument "abc" for "--grpc-port" flag: strconv.ParseInt: parsing "abc": invalid syntax',
            id="int",
        ),
        pytest.param(
            ["-v=x"],
            'invalid argument "x" for "-v, --v" flag: strconv.ParseInt: parsing "x": invalid syntax',
            id="v",
        ),
        pytest.param(
            ["--tracing=yes"],
            'invalid argument "yes" for "--tracing" flag: strconv.ParseBool: parsing "yes": invalid syntax',
            id="bool",
        ),
        pytest.param(
            ["--metrics-staleness-threshold=2"],
            'invalid argument "2" for "--metrics-staleness-threshold" flag: '
            'time: missing unit in duration "2"',
            id="duration",
        ),
        pytest.param(["--no-such-flag=1"], "unknown flag: --no-such-flag", id="unknown-long"),
        pytest.param(["-x"], "unknown shorthand flag: 'x' in -x", id="unknown-short"),
        pytest.param(["--grpc-port"], "flag needs an argument: --grpc-port", id="missing-value"),
        pytest.param(["-v"], "flag needs an argument: 'v' in -v", id="missing-v"),
        pytest.param(
            ["--tracing", "false"],
            'unexpected argument "false": the epp takes flags only '
            "(boolean flags take their value inline: --tracing=false)",
            id="bool-with-space",
        ),
        pytest.param(["extra"], 'unexpected argument "extra": the epp takes flags only', id="positional"),
        pytest.param(["--", "x"], 'unexpected argument "x": the epp takes flags only', id="after-dashdash"),
    ],
)
def test_parse_errors(argv: list[str], message: str) -> None:
    """Malformed command lines fail with pflag's wording (and a hint where GIE would silently misparse)."""
    with pytest.raises(ConfigError) as err:
        parse_flags([*POOL, *argv], {})
    assert str(err.value) == message


def test_double_dash_alone_ends_flags() -> None:
    """A trailing ``--`` with nothing after it is accepted."""
    assert parse_flags([*POOL, "--"], {}).pool_name == "pool"


@pytest.mark.parametrize("argv", [pytest.param(["--help"], id="long"), pytest.param(["-h"], id="short")])
def test_help_lists_every_flag_with_its_default(argv: list[str]) -> None:
    """--help raises HelpRequested carrying a usage text that names every flag and shows defaults."""
    with pytest.raises(HelpRequested) as req:
        parse_flags(argv, {})
    text = req.value.text
    for flag in FLAGS:
        assert f"--{flag.name}" in text
    assert "(default 9002)" in text
    assert "(default 50ms)" in text
    assert '(default "inference.networking.k8s.io")' in text
    assert "[new]" in text


def test_explicit_records_flags_given() -> None:
    """``explicit`` holds exactly the flags on the command line, even when set to their default."""
    opts = parse_flags([*POOL, "-v=2", "--tracing=true", "--grpc-port", "9002"], {})
    assert opts.explicit == frozenset({"pool-name", "v", "tracing", "grpc-port"})


@dataclass(frozen=True)
class Case:
    argv: list[str]
    env: dict[str, str]
    message: str


POD = {"POD_NAME": "vllm-epp-5d8f9c7b6-x2x9z"}

VALIDATION: list[Any] = [
    pytest.param(
        Case(
            [],
            {},
            "either pool-name or endpoint-selector must be set "
            "(or, without Kubernetes, endpoints or endpoints-file)",
        ),
        id="none-set",
    ),
    pytest.param(
        Case(
            ["--pool-name=p", "--endpoint-selector=a=b"],
            POD,
            "either pool-name or endpoint-selector must be set",
        ),
        id="pool-and-selector",
    ),
    pytest.param(
        Case(
            ["--pool-name=", "--endpoint-selector="],
            {},
            "either pool-name or endpoint-selector must be set "
            "(or, without Kubernetes, endpoints or endpoints-file)",
        ),
        id="empty-values-count-as-unset",
    ),
    pytest.param(
        Case(["--endpoint-selector=a=b"], POD, 'flag "endpoint-target-ports" should have length from 1 to 8'),
        id="selector-without-ports",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=1,2,3,4,5,6,7,8,9"],
            POD,
            'flag "endpoint-target-ports" should have length from 1 to 8',
        ),
        id="nine-ports",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=8000,65536"],
            POD,
            'invalid port number 65536 in "endpoint-target-ports"',
        ),
        id="port-too-big",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=-1"],
            POD,
            'invalid port number -1 in "endpoint-target-ports"',
        ),
        id="port-negative",
    ),
    pytest.param(
        Case(
            [*POOL, "--config-text=x", "--config-file=y"],
            {},
            'both the "configText" and "configFile" flags can not be set at the same time',
        ),
        id="config-text-and-file",
    ),
    pytest.param(
        Case(
            [*POOL, "--model-server-metrics-scheme=ftp"],
            {},
            'unexpected "ftp" value for "model-server-metrics-scheme" flag, '
            "it can only be set to 'http' or 'https'",
        ),
        id="scheme",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=8000"],
            {},
            "failed to get environment variable POD_NAME",
        ),
        id="standalone-needs-pod-name",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=8000"],
            {"POD_NAME": "epp"},
            "failed to parse deployment name from pod name epp",
        ),
        id="standalone-bad-pod-name",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a", "--endpoint-target-ports=8000"],
            POD,
            'failed to parse endpoint selector "a": invalid selector: [a]',
        ),
        id="selector-no-equals",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b=c", "--endpoint-target-ports=8000"],
            POD,
            'failed to parse endpoint selector "a=b=c": invalid selector: [a b c]',
        ),
        id="selector-two-equals",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=-a=b", "--endpoint-target-ports=8000"],
            POD,
            'failed to parse endpoint selector "-a=b": invalid label key "-a": name part must consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character (at most 63 characters)",
        ),
        id="selector-bad-key",
    ),
    pytest.param(
        Case(
            ["--endpoint-selector=a=b c", "--endpoint-target-ports=8000"],
            POD,
            'failed to parse endpoint selector "a=b c": invalid label value "b c": a label value must '
            "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character (at most 63 characters)",
        ),
        id="selector-bad-value",
    ),
    # ours
    pytest.param(
        Case(
            ["--endpoints=127.0.0.1:8000", "--pool-name=p"],
            {},
            'flags "pool-name" and "endpoints" cannot be set at the same time; '
            "choose one way to find endpoints",
        ),
        id="endpoints-and-pool",
    ),
    pytest.param(
        Case(
            ["--endpoints=127.0.0.1:8000", "--endpoints-file=f.yaml"],
            {},
            'flags "endpoints" and "endpoints-file" cannot be set at the same time; '
            "choose one way to find endpoints",
        ),
        id="endpoints-and-file",
    ),
    pytest.param(
        Case(
            ["--endpoints-file=f.yaml", "--endpoint-selector=a=b", "--pool-name=p"],
            {},
            'flags "pool-name", "endpoint-selector" and "endpoints-file" cannot be set at the same time; '
            "choose one way to find endpoints",
        ),
        id="three-at-once",
    ),
    pytest.param(
        Case(
            [*POOL, "--objectives-file=o.yaml"],
            {},
            'flag "objectives-file" cannot be used with "pool-name": in InferencePool mode objectives and '
            "rewrites come from the InferenceObjective and InferenceModelRewrite resources",
        ),
        id="objectives-file-with-pool",
    ),
    pytest.param(
        Case(
            [*POOL, "--log-format=text"],
            {},
            "unexpected \"text\" value for \"log-format\" flag, it can only be set to 'json' or 'console'",
        ),
        id="log-format",
    ),
    pytest.param(
        Case(
            [*POOL, "--metrics-families=gie,prom"],
            {},
            'invalid value "gie,prom" for "metrics-families": must be a comma-separated list of gie, llm-d',
        ),
        id="metrics-families",
    ),
    pytest.param(
        Case(
            [*POOL, "--max-request-body-bytes=-1"],
            {},
            'invalid value -1 for "max-request-body-bytes": must be >= 0 (0 means unlimited)',
        ),
        id="negative-body-limit",
    ),
    pytest.param(
        Case(
            [*POOL, "--shutdown-grace-period=-5s"],
            {},
            'invalid value "-5s" for "shutdown-grace-period": must not be negative',
        ),
        id="negative-grace",
    ),
    pytest.param(
        Case(
            [*POOL, "--bind-address=localhost"],
            {},
            'invalid value "localhost" for "bind-address": not an IP address',
        ),
        id="bind-address-not-ip",
    ),
    pytest.param(
        Case([*POOL, "--grpc-port=70000"], {}, 'invalid port number 70000 in "grpc-port"'),
        id="grpc-port-range",
    ),
    pytest.param(
        Case([*POOL, "--metrics-port=-1"], {}, 'invalid port number -1 in "metrics-port"'),
        id="metrics-port-range",
    ),
    pytest.param(
        Case(
            ["--endpoints=127.0.0.1:8000", "--ha-enable-leader-election"],
            {},
            'flag "ha-enable-leader-election" needs Kubernetes: set "pool-name" or "endpoint-selector" '
            "(the lease lives in the API server)",
        ),
        id="leader-election-without-kubernetes",
    ),
    pytest.param(
        Case(
            [*POOL, "--leader-election-renew-deadline=20s"],
            {},
            '"leader-election-lease-duration" > "leader-election-renew-deadline" > '
            '1.2 x "leader-election-retry-period" > 0 is required, got 15s, 20s and 2s',
        ),
        id="leader-election-timings",
    ),
    pytest.param(
        Case(
            [*POOL, "--shutdown-delay=-1s"],
            {},
            'invalid value "-1s" for "shutdown-delay": must not be negative',
        ),
        id="negative-shutdown-delay",
    ),
]


@pytest.mark.parametrize("case", VALIDATION)
def test_validation_messages(case: Case) -> None:
    """Each invalid combination fails with GIE's exact message (or ours, for flags GIE lacks)."""
    with pytest.raises(ConfigError) as err:
        parse_flags(case.argv, case.env)
    assert str(err.value) == case.message


@pytest.mark.parametrize("flag", [pytest.param(f, id=f) for f in DEPRECATED_METRIC_FLAGS])
def test_deprecated_metric_flags_rejected_only_when_set(flag: str) -> None:
    """The five metric-name flags fail when given, even with their default value, and never otherwise."""
    default = GIE_DEFAULTS[flag]
    with pytest.raises(ConfigError) as err:
        parse_flags([*POOL, f"--{flag}={default}"], {})
    assert str(err.value) == (
        f'flag "{flag}" is deprecated and cannot be used; '
        "configure metrics via engineConfigs in EndpointPickerConfig instead"
    )
    assert getattr(parse_flags(POOL, {}), attr(flag)) == default


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        pytest.param("--pool-namespace=ns", {"NAMESPACE": "env-ns"}, "ns", id="flag-wins"),
        pytest.param("--pool-namespace=", {"NAMESPACE": "env-ns"}, "env-ns", id="env-when-flag-empty"),
        pytest.param("", {"NAMESPACE": ""}, "default", id="default-when-env-empty"),
        pytest.param("", {}, "default", id="default"),
    ],
)
def test_pool_namespace_resolution(flag: str, env: dict[str, str], expected: str) -> None:
    """--pool-namespace, else env NAMESPACE, else "default"."""
    argv = [*POOL, flag] if flag else POOL
    assert parse_flags(argv, env).pool_namespace == expected


@pytest.mark.parametrize(
    ("argv", "env", "mode", "label", "deployment"),
    [
        pytest.param(POOL, POD, "pool", "pool", "", id="pool"),
        pytest.param(
            ["--endpoint-selector=app=vllm,env=prod", "--endpoint-target-ports=8000"],
            POD,
            "selector",
            "vllm-epp",
            "vllm-epp",
            id="selector-deployment-from-pod",
        ),
        pytest.param(["--endpoints=10.0.0.1:8000"], {}, "endpoints", "epp", "", id="endpoints-no-pod"),
        pytest.param(
            ["--endpoints=10.0.0.1:8000"], POD, "endpoints", "vllm-epp", "vllm-epp", id="endpoints-pod"
        ),
        pytest.param(
            ["--endpoints-file=e.yaml"],
            {"POD_NAME": "x"},
            "endpoints-file",
            "epp",
            "",
            id="file-odd-pod-name",
        ),
    ],
)
def test_modes_and_pool_label(
    argv: list[str], env: dict[str, str], mode: str, label: str, deployment: str
) -> None:
    """Exactly one discovery mode applies; the pool label comes from the pool, POD_NAME, or "epp"."""
    opts = parse_flags(argv, env)
    assert (opts.mode, opts.pool_label, opts.deployment_name) == (mode, label, deployment)


def test_selector_labels_parsed() -> None:
    """The selector becomes ordered label pairs; spaces around keys and values are trimmed, as k8s does."""
    opts = parse_flags(
        ["--endpoint-selector=app=vllm, tier = gpu,example.com/role=", "--endpoint-target-ports=8000"], POD
    )
    assert opts.endpoint_selector_labels == (("app", "vllm"), ("tier", "gpu"), ("example.com/role", ""))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("10.0.0.1:8000", (HostPort("10.0.0.1", 8000),), id="ipv4"),
        pytest.param("[::1]:8000", (HostPort("::1", 8000),), id="ipv6"),
        pytest.param(
            "[fd00::2]:8001,10.0.0.1:8000", (HostPort("fd00::2", 8001), HostPort("10.0.0.1", 8000)), id="mix"
        ),
        pytest.param("localhost:8000", (HostPort("localhost", 8000),), id="hostname"),
        pytest.param("vllm-0.vllm.ns.svc:8000", (HostPort("vllm-0.vllm.ns.svc", 8000),), id="fqdn"),
        pytest.param(
            " 10.0.0.1:8000 , 10.0.0.2:8000",
            (HostPort("10.0.0.1", 8000), HostPort("10.0.0.2", 8000)),
            id="spaces",
        ),
        pytest.param("10.0.0.1:8000,10.0.0.1:8000", (HostPort("10.0.0.1", 8000),), id="dedup"),
    ],
)
def test_endpoints_parse(value: str, expected: tuple[HostPort, ...]) -> None:
    """--endpoints takes HOST:PORT entries, IPv6 in brackets, de-duplicated in order."""
    assert parse_flags([f"--endpoints={value}"], {}).endpoints == expected


@pytest.mark.parametrize(
    ("value", "entry", "detail"),
    [
        pytest.param("10.0.0.1", "10.0.0.1", "missing port", id="no-port"),
        pytest.param("10.0.0.1:", "10.0.0.1:", 'port "" is not a number from 1 to 65535', id="empty-port"),
        pytest.param("10.0.0.1:0", "10.0.0.1:0", 'port "0" is not a number from 1 to 65535', id="port-zero"),
        pytest.param("h:65536", "h:65536", 'port "65536" is not a number from 1 to 65535', id="port-big"),
        pytest.param("h:http", "h:http", 'port "http" is not a number from 1 to 65535', id="named-port"),
        pytest.param(":8000", ":8000", "missing host", id="no-host"),
        pytest.param(
            "::1:8000", "::1:8000", "an IPv6 address must be in brackets, e.g. [::1]:8000", id="bare-ipv6"
        ),
        pytest.param("[::1]8000", "[::1]8000", "missing port", id="bracket-no-colon"),
        pytest.param("[::1:8000", "[::1:8000", "missing ']' after an IPv6 address", id="unclosed-bracket"),
        pytest.param(
            "[10.0.0.1]:8000",
            "[10.0.0.1]:8000",
            '"10.0.0.1" in brackets is not an IPv6 address',
            id="v4-in-brackets",
        ),
        pytest.param(
            "a_b:8000", "a_b:8000", '"a_b" is neither an IP address nor a DNS name', id="bad-hostname"
        ),
        pytest.param("10.0.0.1:8000,", "", "empty entry", id="trailing-comma"),
    ],
)
def test_endpoints_invalid(value: str, entry: str, detail: str) -> None:
    """Each bad --endpoints entry is named in the error, with what is wrong with it."""
    with pytest.raises(ConfigError) as err:
        parse_flags([f"--endpoints={value}"], {})
    assert str(err.value) == f'invalid endpoint "{entry}" in "endpoints": {detail}'


def test_host_port_str_brackets_ipv6() -> None:
    """HostPort prints as Go's net.JoinHostPort would."""
    assert [str(HostPort("::1", 80)), str(HostPort("10.0.0.1", 80))] == ["[::1]:80", "10.0.0.1:80"]
    assert HostPort("::1", 80).is_ip
    assert not HostPort("localhost", 80).is_ip


@pytest.mark.parametrize(
    ("argv", "explicitly_set"),
    [
        pytest.param([], frozenset(), id="none"),
        pytest.param(["--model-server-metrics-port=9100"], frozenset({"port"}), id="port"),
        pytest.param(
            [
                "--model-server-metrics-scheme=https",
                "--model-server-metrics-path=/m",
                "--model-server-metrics-https-insecure-skip-verify=false",
            ],
            frozenset({"scheme", "path", "insecure_skip_verify"}),
            id="three",
        ),
    ],
)
def test_model_server_metrics_flags(argv: list[str], explicitly_set: frozenset[str]) -> None:
    """The config builder gets the four metrics values and which of them were explicitly set."""
    opts = parse_flags([*POOL, *argv], {})
    m = opts.model_server_metrics
    assert m.explicitly_set == explicitly_set
    assert opts.build_metrics_flags(ModelServerMetricsFlags) == m
    assert len(opts.notices) == len(explicitly_set)


def test_cert_reload_without_cert_path_is_noticed() -> None:
    """--enable-cert-reload with no --cert-path is accepted but leaves a notice for the log."""
    opts = parse_flags([*POOL, "--enable-cert-reload"], {})
    assert opts.notices == ('flag "enable-cert-reload" has no effect without "cert-path"',)


@pytest.mark.parametrize(
    ("flag", "value", "ok"),
    [
        pytest.param("zap-encoder", "console", True, id="encoder-console"),
        pytest.param("zap-encoder", "JSON", True, id="encoder-case-insensitive"),
        pytest.param("zap-encoder", "text", False, id="encoder-bad"),
        pytest.param("zap-log-level", "debug", True, id="level-debug"),
        pytest.param("zap-log-level", "panic", True, id="level-panic"),
        pytest.param("zap-log-level", "5", True, id="level-int"),
        pytest.param("zap-log-level", "0", False, id="level-zero"),
        pytest.param("zap-log-level", "warn", False, id="level-warn"),
        pytest.param("zap-stacktrace-level", "error", True, id="stack-error"),
        pytest.param("zap-stacktrace-level", "debug", False, id="stack-debug"),
        pytest.param("zap-time-encoding", "rfc3339nano", True, id="time-rfc3339nano"),
        pytest.param("zap-time-encoding", "iso8601", True, id="time-iso8601"),
        pytest.param("zap-time-encoding", "nanos", True, id="time-nanos"),
        pytest.param("zap-time-encoding", "unix", False, id="time-bad"),
        pytest.param("zap-devel", "false", True, id="devel"),
    ],
)
def test_zap_flags_accept_controller_runtime_values(flag: str, value: str, ok: bool) -> None:
    """--zap-* flags take controller-runtime's values and reject others with its message."""
    argv = [*POOL, f"--{flag}={value}"]
    if ok:
        assert flag in parse_flags(argv, {}).explicit
        return
    with pytest.raises(ConfigError, match=f'^invalid argument "{value}" for "--{flag}" flag: invalid '):
        parse_flags(argv, {})
