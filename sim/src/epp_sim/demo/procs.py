"""Run the simulator fleet and the EPP as subprocesses (demo, end-to-end tests, benchmarks)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import pathlib
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class _Handed:
    """Ports this process handed out lately, never handed out again while remembered.

    A port is free only until someone binds it, and a test often asks for the ports of several
    processes before starting any: the kernel may give one of them out twice in that window
    (seen in CI: replica b's gRPC port was replica a's metrics port).  Remembering the last
    ``keep`` ports handed out closes that window within this process."""

    def __init__(self, keep: int = 4096) -> None:
        self._order: collections.deque[int] = collections.deque()
        self._set: set[int] = set()
        self._keep = keep

    def fresh(self, port: int) -> bool:
        return port not in self._set

    def take(self, *ports: int) -> None:
        for port in ports:
            self._order.append(port)
            self._set.add(port)
        while len(self._order) > self._keep:
            self._set.discard(self._order.popleft())


_HANDED = _Handed()


def free_port() -> int:
    """An ephemeral port that was free a moment ago and not handed out lately by this process."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ephemeral ports free a moment ago, none handed out lately by this process.
    All are bound at once: asked one at a time, the kernel may hand the same port out twice (seen:
    a CI run's EPP given one port for its health and metrics servers)."""
    socks: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            if len(socks) > n + 1000:
                raise RuntimeError(f"no {n} free ports")
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)  # held (bound) until all are found: the kernel cannot give it again
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if _HANDED.fresh(port):
                ports.append(port)
        _HANDED.take(*ports)
        return ports
    finally:
        for s in socks:
            s.close()


def free_port_pair() -> int:
    """A free port whose successor is free too: an EPP's sync PUB and its warm-start socket
    (``--peer-port`` and the port after it)."""
    for _ in range(100):
        port = free_ports(1)[0]
        if not _HANDED.fresh(port + 1):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _HANDED.take(port + 1)
        return port
    raise RuntimeError("no free port pair")


def _bin(name: str) -> str:
    """A console script installed next to this interpreter (the project's venv)."""
    path = pathlib.Path(sys.executable).parent / name
    return str(path) if path.exists() else name


class _Proc:
    """A child process in its own session, with stderr kept in a file for post-mortems."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self._dir = tempfile.TemporaryDirectory(prefix=f"epp-{name}-")
        self.log_path = pathlib.Path(self._dir.name) / f"{name}.log"

    async def _spawn(
        self, argv: Sequence[str], *, stdout: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        with open(self.log_path, "wb") as log:  # noqa: ASYNC230 - once per process start; the child keeps the fd
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=stdout if stdout is not None else asyncio.subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    def log_tail(self, n: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            await self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        return proc.returncode

    def cleanup(self) -> None:
        self._dir.cleanup()


class SimFleet(_Proc):
    """``epp-sim`` with N replicas on ephemeral ports; ``ports`` lists them in replica order."""

    def __init__(self, replicas: int, *args: str) -> None:
        super().__init__("sim")
        self.replicas = replicas
        self.args = args
        self.ports: list[int] = []
        self.listeners: list[dict[str, Any]] = []
        self.grpc_listeners: list[dict[str, Any]] = []

    @property
    def hostports(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    @property
    def grpc_hostports(self) -> list[str]:
        """The vLLM gRPC engine ports (``--grpc-base-port``), in replica order."""
        return [f"127.0.0.1:{d['port']}" for d in self.grpc_listeners]

    async def __aenter__(self) -> SimFleet:
        await self._spawn(
            [_bin("epp-sim"), "--replicas", str(self.replicas), "--base-port", "0", *self.args],
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(30):
                await self._read_listeners()
        except BaseException:
            await self.stop()
            raise
        self.ports = [int(d["port"]) for d in self.listeners]
        return self

    async def _read_listeners(self) -> None:
        """One JSON line per listening port on stdout; stop at the last HTTP replica."""
        proc = self.proc
        if proc is None or proc.stdout is None:
            raise RuntimeError("epp-sim was not started with a stdout pipe")
        want = {"http": self.replicas, "grpc": self.replicas if "--grpc-base-port" in self.args else 0}
        seen = {"http": 0, "grpc": 0}
        while any(seen[k] < want[k] for k in want):
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"epp-sim exited early:\n{self.log_tail()}")
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and "port" in data:
                    kind = data.get("protocol", "http")
                    seen[kind] = seen.get(kind, 0) + 1
                    (self.listeners if kind == "http" else self.grpc_listeners).append(data)

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self.cleanup()


class PdProxyProcess(_Proc):
    """``epp-pd-proxy`` on an ephemeral port in front of the decode engine at ``vllm_port``."""

    def __init__(self, vllm_port: int, *args: str) -> None:
        super().__init__("pd-proxy")
        self.vllm_port = vllm_port
        self.args = args
        self.port = 0

    async def __aenter__(self) -> PdProxyProcess:
        argv = [_bin("epp-pd-proxy"), "--port", "0", "--vllm-port", str(self.vllm_port), *self.args]
        await self._spawn(argv, stdout=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(30):
                self.port = await self._read_port()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _read_port(self) -> int:
        """The proxy prints one JSON line with its port once it listens."""
        proc = self.proc
        if proc is None or proc.stdout is None:
            raise RuntimeError("epp-pd-proxy was not started with a stdout pipe")
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"epp-pd-proxy exited early:\n{self.log_tail()}")
        return int(json.loads(line)["port"])

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self.cleanup()


class PdFleet:
    """A P/D fleet: ``prefill`` pods (``epp-sim --role prefill``) and ``decode`` pods
    (``--role decode``), each decode pod behind its own ``epp-pd-proxy`` on the pool port, as llm-d
    deploys its sidecar. ``endpoints()`` lists the pool with ``llm-d.ai/role`` labels for an
    ``--endpoints-file``; ``prefill`` may be 0 (a pool without prefill pods).

    ``prefill_decode`` adds pods that serve both roles (``llm-d.ai/role: prefill-decode``,
    ``--role both``), each behind its own proxy like a decode pod: the EPP may pick one to decode
    (with a prefill leg from elsewhere, or the whole request) or to prefill, the prefill leg then
    passing through that pod's proxy unchanged (no ``x-prefiller-host-port``: a plain proxy). A
    symmetric fleet is ``PdFleet(0, 0, ..., prefill_decode=4)``."""

    ROLE_LABEL = "llm-d.ai/role"

    def __init__(
        self,
        prefill: int,
        decode: int,
        *sim_args: str,
        proxy_args: Sequence[str] = (),
        prefill_decode: int = 0,
    ) -> None:
        self.n_prefill = prefill
        self.n_decode = decode
        self.n_prefill_decode = prefill_decode
        self.sim_args = sim_args
        self.proxy_args = tuple(proxy_args)
        self.prefill: SimFleet | None = None
        self.decode: SimFleet | None = None
        self.prefill_decode: SimFleet | None = None
        self.proxies: list[PdProxyProcess] = []  # decode pods' first, then prefill-decode pods'
        self.pd_proxies: list[PdProxyProcess] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> PdFleet:
        try:
            if self.n_prefill:
                self.prefill = await self._stack.enter_async_context(
                    SimFleet(self.n_prefill, *self.sim_args, "--role", "prefill", "--name-prefix", "prefill")
                )
            if self.n_decode:
                self.decode = await self._stack.enter_async_context(
                    SimFleet(self.n_decode, *self.sim_args, "--role", "decode", "--name-prefix", "decode")
                )
            if self.n_prefill_decode:
                self.prefill_decode = await self._stack.enter_async_context(
                    SimFleet(self.n_prefill_decode, *self.sim_args, "--role", "both", "--name-prefix", "pd")
                )
            for sims, extra in ((self.decode, None), (self.prefill_decode, self.pd_proxies)):
                for port in sims.ports if sims is not None else ():
                    proxy = await self._stack.enter_async_context(PdProxyProcess(port, *self.proxy_args))
                    self.proxies.append(proxy)
                    if extra is not None:
                        extra.append(proxy)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def prefill_hostports(self) -> list[str]:
        return self.prefill.hostports if self.prefill is not None else []

    @property
    def decode_hostports(self) -> list[str]:
        """Every decode-capable pod's pool port: its proxy (decode, then prefill-decode pods)."""
        return [f"127.0.0.1:{p.port}" for p in self.proxies]

    @property
    def prefill_decode_hostports(self) -> list[str]:
        return [f"127.0.0.1:{p.port}" for p in self.pd_proxies]

    @property
    def engines(self) -> list[str]:
        """Every engine's own port (for /sim/state), prefill, decode, prefill-decode."""
        return [hp for f in (self.prefill, self.decode, self.prefill_decode) if f for hp in f.hostports]

    @property
    def hostports(self) -> list[str]:
        return self.prefill_hostports + self.decode_hostports

    def endpoints(self) -> list[dict[str, Any]]:
        """The pool as endpoints-file entries (address, port, name, labels)."""
        out = []
        pd = set(self.prefill_decode_hostports)
        roles = (  # (label, name prefix: the simulator's, so x-inference-pod names the entry)
            ("prefill", "prefill", self.prefill_hostports),
            ("decode", "decode", [hp for hp in self.decode_hostports if hp not in pd]),
            ("prefill-decode", "pd", self.prefill_decode_hostports),
        )
        for role, prefix, hostports in roles:
            for i, hp in enumerate(hostports):
                host, port = hp.rsplit(":", 1)
                out.append(
                    {
                        "address": host,
                        "port": int(port),
                        "name": f"{prefix}-{i}",
                        "labels": {self.ROLE_LABEL: role},
                    }
                )
        return out

    def write_endpoints_file(self, path: pathlib.Path) -> pathlib.Path:
        path.write_text(json.dumps({"endpoints": self.endpoints()}, indent=1) + "\n")  # YAML reads JSON
        return path


class EppProcess(_Proc):
    """The ``epp`` command on free ports, plaintext, waited on until its health check says SERVING."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, health_service: str = "inference-extension"
    ) -> None:
        super().__init__("epp")
        self.args = args
        self.env = env
        self.health_service = health_service  # with leader election: "liveness" (up) or "readiness" (leads)
        self.grpc_port, self.health_port, self.metrics_port = free_ports(3)

    def argv(self) -> list[str]:
        return [
            _bin("epp"),
            f"--grpc-port={self.grpc_port}",
            f"--grpc-health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--secure-serving=false",
            "--tracing=false",
            "--metrics-endpoint-auth=false",
            # One process unless the caller asks for workers (a later --workers wins): the tests
            # and benches read per-process state (/debug/plugins/state) and compare with one core.
            "--workers=1",
            *self.args,
        ]

    async def __aenter__(self) -> EppProcess:
        await self.start()
        return self

    async def start(self, timeout: float = 30.0, *, wait: bool = True) -> None:
        await self._spawn(self.argv(), env=self.env)
        if not wait:
            return
        try:
            await self.wait_serving(timeout)
        except BaseException:
            await self.stop()
            raise

    async def serving(self, service: str | None = None) -> bool:
        """One gRPC health Check of ``service`` (default ``health_service``): SERVING or not (or down)."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health_port}") as ch:
            req = health_pb2.HealthCheckRequest(service=self.health_service if service is None else service)
            try:
                resp = await health_pb2_grpc.HealthStub(ch).Check(req, timeout=1)
            except grpc.aio.AioRpcError:
                return False
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def wait_serving(self, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                if self.proc is not None and self.proc.returncode is not None:
                    raise RuntimeError(f"epp exited with {self.proc.returncode}:\n{self.log_tail()}")
                if await self.serving():
                    return
                await asyncio.sleep(0.05)  # poll interval against another process

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self.cleanup()
