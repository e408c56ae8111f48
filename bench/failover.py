"""Kubernetes-mode timings: leader failover under load, and a new pod's first routed request.

Run ``python -m bench.failover [--quick]``; prints a table and writes bench/results/failover.json.

Two ``epp --pool-name`` replicas with leader election watch the test API server
(``epp_kubeapi``); Envoy health-checks both on the gRPC ``readiness`` service, as a
Kubernetes Service would route only to the ready (leading) one.  Requests flow at a steady
pace; the leader gets SIGTERM (it releases the lease) or SIGKILL (the lease must expire).
Reported per signal: time until the lease has a new holder, requests that failed, and the
time from the signal to the last failure.  Full mode uses controller-runtime's timings (15 s
lease, 10 s renew deadline, 2 s retry); quick mode 3 s / 2 s / 250 ms.  Separately: the time
from a pod's Ready condition turning True to its first routed request (median of several).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import log, rnd, write_result
from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer
from epp_kubeapi.objects import inference_pool, pod
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port

NS = "default"
LEASE = "epp-default-pool.gateway-api-inference-extension.sigs.k8s.io"
SIM = ("--time-scale", "0.02", "--seed", "7", "--max-model-len", "131072")


async def _request(http: aiohttp.ClientSession, url: str, i: int) -> tuple[bool, str]:
    body = {"model": "mock-model", "prompt": f"r{i}", "max_tokens": 2}
    try:
        async with asyncio.timeout(5), http.post(url + "/v1/completions", json=body) as r:
            await r.read()
            return r.status == 200, r.headers.get("x-epp-destination", "")
    except (TimeoutError, aiohttp.ClientError):
        return False, ""


async def _leader(a: EppProcess, b: EppProcess) -> EppProcess:
    for _ in range(600):
        for e in (a, b):
            if await e.serving("readiness"):
                return e
    raise RuntimeError("no EPP became leader")


class Fleet:
    def __init__(self, api: KubeApiServer) -> None:
        self.api = api
        self.port = free_port()
        self.sims: list[SimFleet] = []

    async def add(self, name: str, *, ready: bool = True) -> str:
        ip = f"127.0.0.{20 + len(self.sims)}"
        sim = SimFleet(1, "--host", ip, "--base-port", str(self.port), "--name-prefix", name, *SIM)
        await sim.__aenter__()
        self.sims.append(sim)
        self.api.create(pod(name, ip, ready=ready))
        return ip

    async def close(self) -> None:
        for s in self.sims:
            await s.__aexit__(None, None, None)


def _holder(api: KubeApiServer) -> str:
    lease = api.get("coordination.k8s.io/v1", "Lease", NS, LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def failover(sig: signal.Signals, timings: tuple[str, str, str], tmp: Path) -> dict[str, Any]:
    lease, renew, retry = timings
    api = KubeApiServer(bookmark_interval=1.0)
    api.register_inference_crds()
    async with api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        fleet = Fleet(api)
        api.create(inference_pool(ports=(fleet.port,)))
        try:
            for i in range(2):
                await fleet.add(f"pod-{i}")
            args = (
                "--pool-name=pool",
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                "--ha-enable-leader-election",
                f"--leader-election-lease-duration={lease}",
                f"--leader-election-renew-deadline={renew}",
                f"--leader-election-retry-period={retry}",
            )
            a = EppProcess(*args, env={"POD_NAME": "epp-a-0"}, health_service="liveness")
            b = EppProcess(*args, env={"POD_NAME": "epp-b-0"}, health_service="liveness")
            async with a, b:
                leader = await _leader(a, b)
                cfg = EnvoyConfig(
                    ext_proc_port=a.grpc_port,
                    ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
                )
                async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                    results: list[tuple[float, bool]] = []
                    stop = asyncio.Event()

                    async def load() -> None:
                        i = 0
                        while not stop.is_set():
                            i += 1
                            t = time.monotonic()
                            ok, _ = await _request(http, proxy.url, i)
                            results.append((t, ok))
                            await asyncio.sleep(0.02)

                    task = asyncio.create_task(load())
                    await until(lambda: sum(ok for _, ok in results) >= 50, 30, what="warm load")
                    old = _holder(api)
                    t0 = time.monotonic()
                    await leader.signal(sig)
                    await until(lambda: _holder(api) not in ("", old), 60, what="a new lease holder")
                    handover = time.monotonic() - t0
                    await asyncio.sleep(max(3.0, handover))  # keep the load on after the handover
                    stop.set()
                    await task
        finally:
            await fleet.close()
    after = [(t - t0, ok) for t, ok in results if t >= t0]
    failures = [t for t, ok in after if not ok]
    return {
        "signal": sig.name,
        "lease_handover_s": rnd(handover),
        "requests_after_signal": len(after),
        "failed": len(failures),
        "last_failure_after_s": rnd(max(failures)) if failures else 0.0,
    }


async def first_request_after_ready(tmp: Path, trials: int) -> list[float]:
    api = KubeApiServer(bookmark_interval=1.0)
    api.register_inference_crds()
    out: list[float] = []
    async with api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        fleet = Fleet(api)
        api.create(inference_pool(ports=(fleet.port,)))
        try:
            await fleet.add("pod-0")
            e = EppProcess("--pool-name=pool", f"--kubeconfig={kubeconfig}", "--bind-address=127.0.0.1")
            async with (
                e,
                Envoy(EnvoyConfig(ext_proc_port=e.grpc_port)) as proxy,
                aiohttp.ClientSession() as http,
            ):
                for n in range(1, trials + 1):
                    ip = await fleet.add(f"pod-{n}", ready=False)
                    t0 = time.monotonic()
                    api.patch(
                        "v1",
                        "Pod",
                        NS,
                        f"pod-{n}",
                        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                    )
                    i = 0
                    while True:
                        i += 1
                        _, dest = await _request(http, proxy.url, i)
                        if dest.startswith(ip + ":"):
                            out.append(time.monotonic() - t0)
                            break
        finally:
            await fleet.close()
    return out


async def main_async(quick: bool) -> dict[str, Any]:
    timings = ("3s", "2s", "250ms") if quick else ("15s", "10s", "2s")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            log(f"failover: {sig.name} with lease/renew/retry {timings}")
            rows.append(await failover(sig, timings, Path(d)))
        log("first routed request after a pod turns ready")
        ready = await first_request_after_ready(Path(d), 3 if quick else 8)
    return {
        "leader_election": {"lease": timings[0], "renew_deadline": timings[1], "retry_period": timings[2]},
        "failover": rows,
        "ready_to_first_request_ms": {
            "median": rnd(statistics.median(ready) * 1000, 1),
            "max": rnd(max(ready) * 1000, 1),
            "samples": [rnd(x * 1000, 1) for x in ready],
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    doc = asyncio.run(main_async(args.quick))
    print(f"{'signal':>8} {'handover':>10} {'failed':>8} {'of':>6} {'last failure':>13}")
    for r in doc["failover"]:
        print(
            f"{r['signal']:>8} {r['lease_handover_s']:>9}s {r['failed']:>8} {r['requests_after_signal']:>6} "
            f"{r['last_failure_after_s']:>12}s"
        )
    print(f"ready → first routed request: {doc['ready_to_first_request_ms']}")
    with contextlib.suppress(OSError):
        write_result("failover", doc, mode="quick" if args.quick else "full", seeds={"sim": 7})


if __name__ == "__main__":
    main()
