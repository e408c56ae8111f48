"""The request paths compared by the overhead, long-prompt and streaming benchmarks.

A ``Lab`` starts the near-instant upstreams (bench/upstream.py) and, for each requested path,
the processes in front of them; every path stays up for the whole benchmark so that rounds can
interleave paths (machine drift then hits every path alike).  Each path knows the pids whose CPU
is charged to it: the routing processes only (Envoy, the ext_proc server, the router), never the
upstreams or the load generator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from bench.common import (
    CONFIGS,
    ROOT,
    Child,
    CpuMeter,
    PeerRouter,
    PeerSpec,
    idle_cores,
    log,
    peer_installed,
    python_module,
)
from bench.httpload import Pool
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess


def _lean_envoy() -> dict[str, object]:
    """EnvoyConfig overrides reproducing deploy/envoy/lean.yaml's ext_proc settings (read from the
    file, so the benchmark measures the config we ship): BUFFERED request bodies, STREAMED response
    bodies, allow_mode_override with the modes the EPP asks for (docs/envoy.md)."""
    doc = yaml.safe_load((ROOT / "deploy" / "envoy" / "lean.yaml").read_text())
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (cfg,) = (f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    mode = cfg["processing_mode"]
    return {
        **{k: mode[k] for k in ("request_body_mode", "response_body_mode", "response_header_mode")},
        **{k: mode[k] for k in ("request_trailer_mode", "response_trailer_mode")},
        "allow_mode_override": cfg["allow_mode_override"],
        "buffer_limit_bytes": 1 << 20,  # lean.yaml: 16 MiB; 1 MiB holds every benchmark body
        "extra_ext_proc": {"allowed_override_modes": cfg["allowed_override_modes"]},
    }


# Envoy settings in which the EPP may ask Envoy to skip response phases: deploy/envoy/lean.yaml.
LEAN: dict[str, object] = _lean_envoy()
SKIPPABLE = LEAN  # the older name (bench/streaming.py, tests)


@dataclass(frozen=True, slots=True)
class PathSpec:
    """How to build one path: a direct hop, Envoy alone, Envoy + an ext_proc server, or a peer."""

    name: str
    kind: str  # "direct" | "envoy" | "floor" | "epp" | "peer"
    epp_config: str = ""  # a file in bench/configs ("" = the built-in default)
    envoy: tuple[tuple[str, object], ...] = ()  # EnvoyConfig overrides
    peer: PeerSpec | None = None
    label: str = ""
    transport: str = "grpcio"  # the no-op floor's: "grpcio" (grpc.aio) or "h2" (the EPP's own)
    # The no-op floor's response phases where Envoy honours mode_override: "all", or "none" (it asks
    # Envoy to skip them, as the EPP does when no plugin reads the response).
    response_phases: str = "all"
    floor: str = ""  # an EPP path's fair floor: the no-op path under the same Envoy config and phases

    @property
    def title(self) -> str:
        return self.label or self.name


DIRECT = PathSpec("direct", "direct", label="(a) direct")
ENVOY = PathSpec("envoy", "envoy", label="(b) Envoy alone")
FLOOR = PathSpec("floor", "floor", label="(c) Envoy + no-op Python ext_proc (grpc.aio)")
# The honest floor under the EPP: the same no-op server on the EPP's own transport (src/epp/server/h2,
# the EPP's default), so that "EPP over this floor" is the cost of routing, not of the transport.
FLOOR_H2 = PathSpec(
    "floor-h2", "floor", transport="h2", label="(c') Envoy + no-op Python ext_proc (EPP's own h2 transport)"
)
EPP = PathSpec("epp", "epp", floor="floor-h2", label="(d) Envoy + EPP (default config)")
EPP_PREFIX = PathSpec(
    "epp-prefix",
    "epp",
    epp_config="prefix-heavy.yaml",
    floor="floor-h2",
    label="(d) Envoy + EPP (prefix-heavy)",
)
# deploy/envoy/lean.yaml: the default config reads no response, so the EPP asks Envoy to skip it; its
# fair floor asks for the same.  prefix-heavy's plugins read response bodies, so nothing is skipped.
_LEAN = tuple(LEAN.items())
FLOOR_H2_LEAN = PathSpec(
    "floor-h2-lean",
    "floor",
    transport="h2",
    envoy=_LEAN,
    response_phases="none",
    label="(c'') no-op ext_proc on h2, lean Envoy, response skipped",
)
FLOOR_H2_LEAN_FULL = PathSpec(
    "floor-h2-lean-full",
    "floor",
    transport="h2",
    envoy=_LEAN,
    label="(c'') no-op ext_proc on h2, lean Envoy, response sent",
)
EPP_LEAN = PathSpec(
    "epp-lean", "epp", envoy=_LEAN, floor="floor-h2-lean", label="(d) Envoy lean + EPP (default)"
)
EPP_PREFIX_LEAN = PathSpec(
    "epp-prefix-lean",
    "epp",
    epp_config="prefix-heavy.yaml",
    envoy=_LEAN,
    floor="floor-h2-lean-full",
    label="(d) Envoy lean + EPP (prefix-heavy)",
)
# deploy/envoy/fail-open.yaml: lean.yaml's modes + failure_mode_allow, so Envoy goes on without the EPP
# when it is down (FULL_DUPLEX_STREAMED does not fail open with Envoy 1.40).
EPP_FAIL_OPEN = PathSpec(
    "epp-fail-open",
    "epp",
    envoy=(*LEAN.items(), ("failure_mode_allow", True)),
    label="(d') Envoy + EPP, fail-open config (BUFFERED, response skipped)",
)
PEERS = (
    PathSpec(
        "vllm-router",
        "peer",
        peer=PeerSpec("vllm-router", "cache_aware"),
        label="(e) vllm-router cache_aware",
    ),
    PathSpec(
        "sglang-router",
        "peer",
        peer=PeerSpec("sglang-router", "cache_aware"),
        label="(e) sglang-router cache_aware",
    ),
)


@dataclass(slots=True)
class Path:
    spec: PathSpec
    url: str
    pids: dict[str, int]
    envoy: Envoy | None = None
    pool: Pool | None = None
    extra: dict[str, object] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)  # cores per process with no traffic

    def meter(self) -> CpuMeter:
        return CpuMeter(self.pids, self.idle)

    @property
    def name(self) -> str:
        return self.spec.name

    def client(self, limit: int = 512) -> Pool:
        if self.pool is None:
            host, port = self.url.removeprefix("http://").rsplit(":", 1)
            self.pool = Pool(host, int(port), limit)
        return self.pool


def available(specs: Sequence[PathSpec]) -> tuple[list[PathSpec], list[str]]:
    """The specs whose tools are installed, and a note for each one left out."""
    keep, notes = [], []
    for s in specs:
        if s.peer is not None and not peer_installed(s.peer.tool):
            notes.append(f"{s.title}: not installed (python -m bench.setup), skipped")
            continue
        keep.append(s)
    return keep, notes


class Lab:
    """Upstreams plus every requested path, started in order and stopped in reverse."""

    def __init__(
        self,
        specs: Sequence[PathSpec],
        *,
        upstreams: int = 4,
        epp_args: Sequence[str] = (),
        chunk_gap_us: float = 0.0,
        idle_window_s: float = 3.0,
    ) -> None:
        self.idle_window_s = idle_window_s
        self.specs = list(specs)
        self.n_upstreams = upstreams
        self.chunk_gap_us = chunk_gap_us
        self.epp_args = list(epp_args)
        self.paths: dict[str, Path] = {}
        self.upstream_pid = 0
        self.hostports: list[str] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Lab:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.paths.values():
            if p.pool is not None:
                p.pool.close()
        await self._stack.aclose()

    async def _start(self) -> None:
        up = await self._stack.enter_async_context(
            Child(
                "upstream",
                python_module(
                    "bench.upstream",
                    "--ports",
                    str(self.n_upstreams),
                    "--chunk-gap-us",
                    str(self.chunk_gap_us),
                ),
            )
        )
        self.upstream_pid = up.pid
        ports = [int(p) for p in up.ready["ports"]]
        self.hostports = [f"127.0.0.1:{p}" for p in ports]
        for spec in self.specs:
            log(f"  starting path {spec.title}")
            self.paths[spec.name] = await self._path(spec)
        await asyncio.sleep(1.0)  # let start-up work (first scrapes, health checks) settle
        idle = await idle_cores({n: p.pids for n, p in self.paths.items()}, self.idle_window_s)
        for name, cores in idle.items():
            self.paths[name].idle = cores
        log("  idle cores: " + ", ".join(f"{n} {sum(c.values()):.3f}" for n, c in idle.items() if c))

    def idle_report(self) -> dict[str, dict[str, float]]:
        return {n: p.idle for n, p in self.paths.items()}

    async def _envoy(self, **kw: object) -> Envoy:
        cfg = EnvoyConfig(**kw)  # type: ignore[arg-type]
        return await self._stack.enter_async_context(Envoy(cfg))

    async def _path(self, spec: PathSpec) -> Path:
        overrides = dict(spec.envoy)
        if spec.kind == "direct":
            return Path(spec, f"http://{self.hostports[0]}", {})
        if spec.kind == "envoy":
            envoy = await self._envoy(upstreams=self.hostports, **overrides)
            return Path(spec, envoy.url, {"envoy": envoy.pid}, envoy)
        if spec.kind == "floor":
            noop = await self._stack.enter_async_context(
                Child(
                    "noop-extproc",
                    python_module(
                        "bench.noop_extproc",
                        "--upstreams",
                        ",".join(self.hostports),
                        "--transport",
                        spec.transport,
                        "--response-phases",
                        spec.response_phases,
                    ),
                )
            )
            envoy = await self._envoy(ext_proc_port=int(noop.ready["port"]), **overrides)
            return Path(spec, envoy.url, {"envoy": envoy.pid, "extproc": noop.pid}, envoy)
        if spec.kind == "epp":
            args = [f"--endpoints={','.join(self.hostports)}", "--bind-address=127.0.0.1", *self.epp_args]
            if spec.epp_config:
                args.append(f"--config-file={CONFIGS / spec.epp_config}")
            epp = await self._stack.enter_async_context(EppProcess(*args))
            envoy = await self._envoy(ext_proc_port=epp.grpc_port, **overrides)
            return Path(spec, envoy.url, {"envoy": envoy.pid, "extproc": epp.pid}, envoy, extra={"epp": epp})
        if spec.kind == "peer":
            assert spec.peer is not None
            router = await self._stack.enter_async_context(PeerRouter(spec.peer, self.hostports))
            return Path(spec, router.url, {"router": router.pid})
        raise ValueError(f"unknown path kind {spec.kind!r}")


async def extproc_messages(path: Path) -> dict[str, int]:
    """Envoy's ext_proc counters (messages sent to / received from the ext_proc server)."""
    if path.envoy is None:
        return {}
    stats = await path.envoy.stats()
    out = {}
    for k, v in stats.items():
        if ".ext_proc." in k and (k.endswith("stream_msgs_sent") or k.endswith("stream_msgs_received")):
            out[k.rsplit(".", 1)[1]] = v
        elif ".ext_proc." in k and k.endswith("streams_started"):
            out["streams_started"] = v
    return out
