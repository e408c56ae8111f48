"""Kubernetes mode end to end: the test API server, ``epp --pool-name``, a real Envoy, and simulated
model-server pods, each on its own loopback IP with the pool's target port (as pods have).

The Pod objects carry the simulators' addresses, so what the EPP routes to is exactly what the
API server says: scale up, scale down, a pod turning unready, a 410 in the middle of churn,
and two EPP replicas with leader election failing over under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer, UserInfo
from epp_kubeapi.objects import inference_pool, pod
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port
from tests.e2e.conftest import FAST_SIM, both_serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mock-model"
NS = "default"


@dataclass
class Cluster:
    """The API server plus simulated pods; ``ips`` maps pod name → its 127.0.0.x address."""

    api: KubeApiServer
    port: int
    kubeconfig: pathlib.Path
    sims: dict[str, SimFleet] = field(default_factory=dict)
    ips: dict[str, str] = field(default_factory=dict)

    async def start_pod(self, name: str, *, ready: bool = True, register: bool = True) -> str:
        ip = f"127.0.0.{10 + len(self.ips)}"
        sim = SimFleet(1, "--host", ip, "--base-port", str(self.port), "--name-prefix", name, *FAST_SIM)
        await sim.__aenter__()
        self.sims[name], self.ips[name] = sim, ip
        if register:
            self.api.create(pod(name, ip, ready=ready))
        return ip

    def set_ready(self, name: str, ready: bool) -> None:
        status = "True" if ready else "False"
        self.api.patch(
            "v1", "Pod", NS, name, {"status": {"conditions": [{"type": "Ready", "status": status}]}}
        )

    async def stop(self) -> None:
        for sim in self.sims.values():
            await sim.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def cluster(tmp: pathlib.Path, pods: int) -> AsyncIterator[Cluster]:
    api = KubeApiServer(bookmark_interval=1.0)
    api.register_inference_crds()
    async with api:
        port = free_port()  # free on 127.0.0.1; every simulated pod listens on it at its own 127.0.0.x
        c = Cluster(api, port, api.write_kubeconfig(tmp / "kubeconfig"))
        api.create(inference_pool(ports=(port,)))
        try:
            for i in range(pods):
                await c.start_pod(f"pod-{i}")
            yield c
        finally:
            await c.stop()


def epp(
    c: Cluster,
    *extra: str,
    health_service: str = "inference-extension",
    mode: tuple[str, ...] = ("--pool-name=pool",),
) -> EppProcess:
    return EppProcess(
        *mode,
        f"--pool-namespace={NS}",
        f"--kubeconfig={c.kubeconfig}",
        "--bind-address=127.0.0.1",
        "--v=3",
        *extra,
        env={"POD_NAME": "epp-7d9f8b6c5d-x2x4z"},
        health_service=health_service,
    )


async def complete(http: aiohttp.ClientSession, url: str, prompt: str = "hello") -> tuple[int, str]:
    """One request through Envoy: (status, the 127.0.0.x that served it or '')."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(url + "/v1/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-epp-destination", "").rsplit(":", 1)[0]


async def served_by(http: aiohttp.ClientSession, url: str, n: int) -> set[str]:
    seen: set[str] = set()
    for i in range(n):
        status, ip = await complete(http, url, f"prompt {i} {time.monotonic()}")
        assert status == 200
        seen.add(ip)
    return seen


async def test_pool_mode_follows_scale_up_unready_scale_down_and_410(tmp_path: pathlib.Path) -> None:
    async with (
        cluster(tmp_path, 2) as c,
        epp(c) as e,
        Envoy(EnvoyConfig(ext_proc_port=e.grpc_port)) as proxy,
        aiohttp.ClientSession() as http,
    ):
        try:
            assert await served_by(http, proxy.url, 20) == {c.ips["pod-0"], c.ips["pod-1"]}

            # scale up: the new pod gets traffic once it is Ready; measure how soon
            new_ip = await c.start_pod("pod-2", ready=False)
            assert new_ip not in await served_by(http, proxy.url, 10)
            t0 = time.monotonic()
            c.set_ready("pod-2", True)
            first = 0.0
            for i in range(400):
                _, ip = await complete(http, proxy.url, f"probe {i}")
                if ip == new_ip:
                    first = time.monotonic() - t0
                    break
            assert first > 0, "the new pod never got a request"
            print(f"\nready → first routed request: {first * 1000:.0f} ms")

            # a pod turning unready leaves at once
            c.set_ready("pod-0", False)
            await _until_not_served(http, proxy.url, c.ips["pod-0"])

            # scale down, with the watch history compacted in the middle of churn (410)
            c.api.down = True
            c.api.delete("v1", "Pod", NS, "pod-1")
            c.set_ready("pod-0", True)
            c.api.compact()
            c.api.down = False
            want = {c.ips["pod-0"], c.ips["pod-2"]}
            await _until_served_set(http, proxy.url, want)
        except BaseException:
            print("---- epp log ----\n", e.log_tail())
            raise


async def _until_not_served(http: aiohttp.ClientSession, url: str, ip: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ip not in await served_by(http, url, 10):
            return
    raise AssertionError(f"{ip} still served after {timeout} s")


async def _until_served_set(
    http: aiohttp.ClientSession, url: str, want: set[str], timeout: float = 15.0
) -> None:
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen = await served_by(http, url, 20)
        if seen == want:
            return
    raise AssertionError(f"served by {seen}, want {want}")


async def test_standalone_selector_mode(tmp_path: pathlib.Path) -> None:
    async with cluster(tmp_path, 2) as c:
        args = ("--endpoint-selector=app=vllm", f"--endpoint-target-ports={c.port}")
        async with (
            epp(c, mode=args) as e,
            Envoy(EnvoyConfig(ext_proc_port=e.grpc_port)) as proxy,
            aiohttp.ClientSession() as http,
        ):
            assert await served_by(http, proxy.url, 20) == {c.ips["pod-0"], c.ips["pod-1"]}
            assert not any("inferencepools" in r.path for r in c.api.requests if r.username)


async def test_starts_during_an_api_outage_and_guards_metrics(tmp_path: pathlib.Path) -> None:
    """No API server at startup: the EPP runs, is not ready, and becomes ready once it can list;
    /metrics needs a token that TokenReview accepts and SubjectAccessReview allows."""
    async with cluster(tmp_path, 1) as c:
        c.api.add_token("prom", UserInfo(username="system:serviceaccount:monitoring:prometheus"))
        c.api.add_token("nobody", UserInfo(username="system:serviceaccount:default:nobody"))
        c.api.allow("system:serviceaccount:monitoring:prometheus", verb="get", path="/metrics")
        c.api.down = True
        e = epp(c, "--metrics-endpoint-auth=true")
        await e.start(wait=False)
        try:
            await until(
                lambda: any(r.path.endswith("/pods") for r in c.api.requests), 20, what="a pod list attempt"
            )
            assert not await e.serving("inference-extension")
            c.api.down = False
            await e.wait_serving(20)
            async with (
                Envoy(EnvoyConfig(ext_proc_port=e.grpc_port)) as proxy,
                aiohttp.ClientSession() as http,
            ):
                assert await served_by(http, proxy.url, 5) == {c.ips["pod-0"]}
                url = f"http://127.0.0.1:{e.metrics_port}/metrics"
                statuses = {}
                for who, headers in (("none", {}), ("nobody", {"Authorization": "Bearer nobody"}),
                                     ("prom", {"Authorization": "Bearer prom"})):  # fmt: skip
                    async with http.get(url, headers=headers) as r:
                        statuses[who] = r.status
                        body = await r.text()
                assert statuses == {"none": 401, "nobody": 403, "prom": 200}
                assert "inference_pool_ready_pods" in body or "inference_objective_request_total" in body
        finally:
            await e.stop()
            e.cleanup()


# --- high availability ---------------------------------------------------------------------


@dataclass
class Load:
    """Requests at a steady pace; records (time, ok) for every one so gaps can be measured."""

    http: aiohttp.ClientSession
    url: str
    results: list[tuple[float, bool]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        i = 0
        while True:
            i += 1
            t = time.monotonic()
            try:
                status, _ = await asyncio.wait_for(complete(self.http, self.url, f"load {i}"), 5)
                ok = status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            self.results.append((t, ok))
            await asyncio.sleep(0.02)  # pacing: the background load's request rate

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def failures_after(self, t0: float) -> int:
        return sum(1 for t, ok in self.results if t >= t0 and not ok)

    def count_after(self, t0: float) -> int:
        return sum(1 for t, _ in self.results if t >= t0)


LE_ARGS = (
    "--ha-enable-leader-election",
    "--leader-election-lease-duration=3s",
    "--leader-election-renew-deadline=2s",
    "--leader-election-retry-period=250ms",
)


def holder(api: KubeApiServer) -> str:
    lease = api.get(
        "coordination.k8s.io/v1", "Lease", NS, "epp-default-pool.gateway-api-inference-extension.sigs.k8s.io"
    )
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_leader_failover_under_load(tmp_path: pathlib.Path, sig: signal.Signals) -> None:
    async with cluster(tmp_path, 2) as c:
        a = epp(c, *LE_ARGS, health_service="liveness")
        b = epp(c, *LE_ARGS, health_service="liveness")
        async with both_serving(a, b):  # started side by side
            await until(lambda: holder(c.api) != "", 10, what="a leader")
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
            )
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                # which process leads: the one whose readiness says SERVING
                leader, follower = await _leader_of(a, b)
                load = Load(http, proxy.url)
                load.start()
                await until(lambda: sum(ok for _, ok in load.results) >= 20, 20, what="warm load")
                old = holder(c.api)
                t_kill = time.monotonic()
                await leader.signal(sig)
                await until(lambda: holder(c.api) not in ("", old), 20, what="a new lease holder")
                t_lease = time.monotonic() - t_kill
                await until(lambda: load.count_after(t_kill + t_lease) >= 20, 20, what="load after failover")
                await load.stop()
                failed = load.failures_after(t_kill)
                total = load.count_after(t_kill)
                print(
                    f"\nfailover ({sig.name}): new leader after {t_lease * 1000:.0f} ms; "
                    f"{failed} of {total} requests failed during and after it"
                )
                assert await follower.serving("readiness")
                # hot standby: once the successor holds the lease (and Envoy's 200 ms health check
                # has seen it), every request routes; nothing waits for a cold datastore
                assert load.failures_after(t_kill + t_lease + 1.0) == 0
                if sig == signal.SIGTERM:  # released: the successor takes over within a retry period
                    assert t_lease < 1.5
                    assert failed <= 2, f"{failed} failed requests"
                else:  # the successor must wait out the lease (3 s here, 15 s by default)
                    assert t_lease < 3.0 + 1.5


async def _leader_of(a: EppProcess, b: EppProcess) -> tuple[EppProcess, EppProcess]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if await a.serving("readiness"):
            return a, b
        if await b.serving("readiness"):
            return b, a
    raise AssertionError("no EPP became ready as leader")
