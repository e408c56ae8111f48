"""Shared pieces of the benchmark harness: progress lines, CPU accounting, child processes, results."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
CONFIGS = BENCH / "configs"
PLOTS = BENCH / "plots"
_TICKS = os.sysconf("SC_CLK_TCK")
_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line with the time since the harness started."""
    el = time.monotonic() - _T0
    print(f"[{int(el // 60):02d}:{el % 60:04.1f}] {msg}", flush=True)


def cpu_split(pid: int) -> tuple[float, float]:
    """utime and stime of a process (all its threads), in seconds; zeros when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS  # fields 14 and 15 of stat(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 when it is gone."""
    user, system = cpu_split(pid)
    return user + system


class CpuMeter:
    """CPU seconds of named processes between ``start()`` and ``stop()``.

    ``idle`` (cores per process, measured with no traffic) is subtracted: background work such
    as the EPP's 50 ms metric scrapes is reported once, not smeared over requests.
    """

    def __init__(self, pids: Mapping[str, int], idle: Mapping[str, float] | None = None) -> None:
        self.pids = dict(pids)
        self.idle = dict(idle or {})
        self._start: dict[str, float] = {}
        self._t0 = 0.0
        self.seconds: dict[str, float] = {}

    def start(self) -> None:
        self._start = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        self.seconds = {
            k: max(0.0, cpu_seconds(p) - self._start.get(k, 0.0) - self.idle.get(k, 0.0) * wall)
            for k, p in self.pids.items()
        }
        return self.seconds


async def idle_cores(pids: Mapping[str, Mapping[str, int]], seconds: float) -> dict[str, dict[str, float]]:
    """Cores each process burns with no traffic, per path: ``{path: {proc: cores}}``."""
    meters = {name: CpuMeter(p) for name, p in pids.items()}
    for m in meters.values():
        m.start()
    await asyncio.sleep(seconds)
    return {name: {k: round(v / seconds, 4) for k, v in m.stop().items()} for name, m in meters.items()}


def sum_cpu(windows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-process CPU seconds (``cpu_s``) of measurement windows, added up."""
    cpu: dict[str, float] = {}
    for w in windows:
        for k, v in w["cpu_s"].items():
            cpu[k] = cpu.get(k, 0.0) + v
    return cpu


def rnd(x: float, nd: int = 3) -> float | None:
    """Round for JSON; NaN and infinities become null."""
    if x != x or x in (float("inf"), float("-inf")):
        return None
    return round(x, nd)


def added_over_floor(
    cells: Mapping[str, Sequence[Mapping[str, float]]], floor: str, keys: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """Per path but ``floor``, per key: the median over rounds of (the path's value - the floor's)
    in the same round (paths interleaved within a round share its machine); None when no round
    has both."""
    out: dict[str, dict[str, float | None]] = {}
    for name, rounds in cells.items():
        if name == floor:
            continue
        out[name] = {}
        for key in keys:
            pairs = zip(rounds, cells[floor], strict=True)
            diffs = [c[key] - f[key] for c, f in pairs if key in c and key in f]
            out[name][key] = rnd(statistics.median(diffs), 1) if diffs else None
    return out


# ---------------------------------------------------------------------------------------------
# machine and versions


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
                break
    load = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "memory_gib": round(mem_gib, 1),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def _pkg(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def envoy_version() -> str:
    from epp_sim.demo.envoy import envoy_binary

    try:
        out = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError, FileNotFoundError):
        return ""
    # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    for part in out.split("/"):
        if part.count(".") == 2 and part.replace(".", "").isdigit():
            return part
    return out.strip()


def versions() -> dict[str, str]:
    from bench.setup import TOOLS, VENVS

    out = {
        "python": platform.python_version(),
        "epp": _pkg("epp"),
        "envoy": envoy_version(),
        "grpcio": _pkg("grpcio"),
        "protobuf": _pkg("protobuf"),
        "uvloop": _pkg("uvloop"),
        "aiohttp": _pkg("aiohttp"),
        "orjson": _pkg("orjson"),
        "py-spy": _pkg("py-spy"),
    }
    for tool in TOOLS:
        marker = VENVS / tool.name / ".bench-installed"
        out[tool.name] = marker.read_text().strip().split("==")[-1] if marker.exists() else "not installed"
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    out["git"] = git + ("+dirty" if dirty else "")
    return out


# ---------------------------------------------------------------------------------------------
# results


def write_result(name: str, doc: dict[str, Any], *, mode: str, seeds: Mapping[str, int]) -> Path:
    """bench/results/<name>.json with what is needed to reproduce it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    full = {
        "benchmark": name,
        "mode": mode,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": _command(),
        "seeds": dict(seeds),
        "machine": machine_info(),
        **doc,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(full, indent=2) + "\n")
    return path


def _command() -> str:
    """How this process was started, as a user would type it (``python -m bench.x --quick``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None else ["python", *sys.argv[:1]]
    return " ".join([*head, *sys.argv[1:]])


def read_result(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# ---------------------------------------------------------------------------------------------
# child processes


class Child:
    """A child process in its own session that prints one JSON line when ready; stops on exit."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: dict[str, Any] = {}
        self._dir = tempfile.TemporaryDirectory(prefix=f"bench-{name}-")
        self.log_path = Path(self._dir.name) / "stderr.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    async def start(self, *, wait_json: bool = True, timeout: float = 60.0) -> None:
        with open(self.log_path, "wb") as err:  # noqa: ASYNC230 - once per start; the child keeps the fd
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdout=asyncio.subprocess.PIPE if wait_json else asyncio.subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                env=self.env,
            )
        if not wait_json:
            return
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await self.proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
                    with contextlib.suppress(ValueError):
                        data = json.loads(line)
                        if isinstance(data, dict):
                            self.ready = data
                            return
        except BaseException:
            await self.stop()
            raise

    async def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self.proc = None

    async def __aenter__(self) -> Child:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self._dir.cleanup()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


async def wait_http(
    url: str, *, timeout: float = 60.0, ok: Sequence[int] = (200,), proc: Child | None = None
) -> None:
    """Poll ``url`` until it answers one of ``ok`` statuses."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with s.get(url) as r:
                    if r.status in ok:
                        return
            if proc is not None and proc.proc is not None and proc.proc.returncode is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode}:\n{proc.log_tail()}")
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# peer routers


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """One peer router configuration: which tool, which policy."""

    tool: str  # "vllm-router" | "sglang-router"
    policy: str

    @property
    def label(self) -> str:
        return f"{self.tool} {self.policy}"


def peer_installed(tool: str) -> bool:
    from bench.setup import venv_bin

    return venv_bin(tool, tool) is not None


class PeerRouter(Child):
    """vllm-router or sglang-router from bench/.venvs, on free loopback ports, ready when /health is."""

    def __init__(self, spec: PeerSpec, workers: Sequence[str]) -> None:
        from bench.setup import venv_bin
        from epp_sim.demo.procs import free_port

        exe = venv_bin(spec.tool, spec.tool)
        if exe is None:
            raise FileNotFoundError(f"{spec.tool} is not installed (python -m bench.setup)")
        self.spec = spec
        self.port = free_port()
        prom = free_port()
        urls = [w if w.startswith("http") else f"http://{w}" for w in workers]
        common = [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(prom),
            "--worker-urls",
            *urls,
            "--policy",
            spec.policy,
            "--worker-startup-check-interval",
            "1",
        ]
        if spec.tool == "vllm-router":
            argv = [str(exe), *common, "--log-level", "warning"]
        else:
            argv = [str(exe), "launch", *common, "--log-level", "warn"]
        super().__init__(spec.tool, argv)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> PeerRouter:
        await self.start(wait_json=False)
        try:
            await wait_http(self.url + "/health", timeout=90, proc=self)
        except BaseException:
            await self.stop()
            raise
        return self
