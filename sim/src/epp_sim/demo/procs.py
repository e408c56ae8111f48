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

# Where handed-out ports come from: below the kernel's ephemeral range, in slices of SLICE.
LOW_PORT = 12288
SLICE = 1024
_XDIST_SLICES = 16  # slices 0-15: pytest-xdist workers gw0-gw15; the rest: other processes, by pid


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections and ``bind(0)`` (Linux's
    ``ip_local_port_range``; 32768 elsewhere, the usual default)."""
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice_index(worker: str | None, pid: int, slices: int) -> int:
    """This process's slice: its xdist worker's (``gw3`` -> 3), or one of the others by pid."""
    if worker is not None and worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % min(_XDIST_SLICES, slices)
    if slices <= _XDIST_SLICES:
        return pid % slices
    return _XDIST_SLICES + pid % (slices - _XDIST_SLICES)


class _Ports:
    """Ports for processes started later, from this process's own slice below the ephemeral range.

    A port is free only until someone binds it, and a test asks for its processes' ports before
    starting them.  Handed out by ``bind(0)``, a port came from the kernel's ephemeral range,
    where in that window any outgoing connection on the machine, or the other xdist worker's
    ``bind(0)``, could take it (seen in CI: an EPP's pre-picked gRPC port in use when it bound;
    earlier, one port given to two of a test's processes).  Here every xdist worker has a slice
    of its own below that range, which no outgoing connection uses; within it a cursor goes
    round, so a port is handed out again only after the slice's other ports have been, and only
    if it is free to bind then.  With no room below the ephemeral range, the kernel's ``bind(0)``
    is the fallback (and ``_recent`` keeps it from giving a port out twice)."""

    def __init__(self, low: int, high: int) -> None:
        self._low, self._high = low, high  # [low, high)
        self._next = low
        self._recent: collections.deque[int] = collections.deque(maxlen=4096)

    @classmethod
    def for_this_process(cls) -> _Ports:
        slices = (_ephemeral_low() - LOW_PORT) // SLICE
        if slices < 1:
            return cls(0, 0)
        low = LOW_PORT + SLICE * _slice_index(os.environ.get("PYTEST_XDIST_WORKER"), os.getpid(), slices)
        return cls(low, low + SLICE)

    def take(self, n: int, *, consecutive: int = 1) -> list[int]:
        """``n`` ports, each the first of ``consecutive`` free ones (all of them handed out)."""
        if self._high <= self._low:
            return self._kernel(n, consecutive)
        out: list[int] = []
        for _ in range(self._high - self._low):
            if len(out) == n:
                break
            port = self._next
            if port + consecutive > self._high:
                self._next = self._low
                continue
            self._next = port + consecutive
            if all(bindable(p) for p in range(port, port + consecutive)):
                out.append(port)
        if len(out) < n:
            raise RuntimeError(f"no {n} free ports in {self._low}-{self._high - 1}")
        return out

    def _kernel(self, n: int, consecutive: int) -> list[int]:
        socks: list[socket.socket] = []
        try:
            out: list[int] = []
            while len(out) < n:
                if len(socks) > n + 1000:
                    raise RuntimeError(f"no {n} free ports")
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)  # held (bound) until all are found: the kernel cannot give it again
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
                more = range(port + 1, port + consecutive)
                if port in self._recent or any(p in self._recent or not bindable(p) for p in more):
                    continue
                out.append(port)
                self._recent.extend(range(port, port + consecutive))
            return out
        finally:
            for s in socks:
                s.close()


def bindable(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 is free to bind now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PORTS = _Ports.for_this_process()


def free_port() -> int:
    """A port that was free a moment ago and is not handed out again soon (``_Ports``)."""
    return _PORTS.take(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free a moment ago, none handed out again soon (``_Ports``)."""
    return _PORTS.take(n)


def free_port_pair() -> int:
    """A free port whose successor is free too: an EPP's sync PUB and its warm-start socket
    (``--peer-port`` and the port after it)."""
    return free_port_run(2)


def free_port_run(n: int) -> int:
    """The first of ``n`` consecutive free ports, all of them handed out: ``--peer-port`` of an
    EPP with ``--workers n/2`` (worker *i* binds the base + 2i and the port after it)."""
    return _PORTS.take(1, consecutive=n)[0]


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
