"""Kubernetes mode (the test API server): active-active replicas both ready and syncing, and a
hot standby under leader election that keeps syncing, so a failover lands on a warm replica."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import aiohttp
import pytest

from epp.testing.waiting import until, until_async
from epp_kubeapi import Resource
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, free_port_pair, free_port_run
from tests.e2e.conftest import QUICK_STOP, both_serving
from tests.e2e.test_kubernetes import LE_ARGS, NS, Cluster, _leader_of, cluster, complete, holder
from tests.sync.test_e2e import CONFIG, _metrics, _plugin_site, _value
from tests.workers.test_epp_workers import _all_up, _children, _run_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SLICES = Resource(group="discovery.k8s.io", version="v1", plural="endpointslices", kind="EndpointSlice")


def _pair(c: Cluster, tmp: pathlib.Path, *extra: str, health: str) -> tuple[EppProcess, EppProcess]:
    (tmp / "config.yaml").write_text(CONFIG)
    site = _plugin_site(tmp)
    pa, pb = free_port_pair(), free_port_pair()
    peers = f"--peers=127.0.0.1:{pa},127.0.0.1:{pb}"
    a, b = (
        _epp_pod(c, tmp, site, f"epp-7d9f8b6c5d-{name}", peers, f"--peer-port={port}", *extra, health=health)
        for name, port in (("a", pa), ("b", pb))
    )
    return a, b


async def _received(http: aiohttp.ClientSession, epp: EppProcess) -> float:
    return _value(await _metrics(http, epp), "epp_sync_batches_received_total")


async def _route_until_received(http: aiohttp.ClientSession, url: str, *epps: EppProcess) -> None:
    """Requests through Envoy, 20 at a time and every one answered 200, until each of ``epps``
    has applied a batch from its peer."""
    async with asyncio.timeout(20):
        while not all([await _received(http, epp) > 0 for epp in epps]):
            results = await asyncio.gather(*(complete(http, url, f"p{i}") for i in range(20)))
            assert all(status == 200 for status, _ in results)


async def test_active_active_both_ready_and_sharing(tmp_path: pathlib.Path) -> None:
    async with cluster(tmp_path, 2) as c:
        a, b = _pair(c, tmp_path, health="readiness")
        async with both_serving(a, b):
            # both ready: no leader needed
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
            )
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                await _route_until_received(http, proxy.url, a, b)


async def test_a_hot_standby_keeps_syncing(tmp_path: pathlib.Path) -> None:
    async with cluster(tmp_path, 2) as c:
        a, b = _pair(c, tmp_path, *LE_ARGS, health="liveness")
        async with both_serving(a, b):
            await until(lambda: holder(c.api) != "", 10, what="a leader")
            leader, standby = await _leader_of(a, b)
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
            )
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                await _route_until_received(http, proxy.url, standby)
                assert not await standby.serving("readiness")  # still a standby, but warm
                assert await leader.serving("readiness")


DISCOVERY_CONFIG = (
    CONFIG.replace(
        "- type: token-load-scorer\n",
        "- type: token-load-scorer\n- type: k8s-peer-discovery\n  name: peers\n"
        "  parameters: {service: epp, portName: peer}\n"
        "- type: metrics-data-source\n- type: core-metrics-extractor\n",
    )
    + "dataLayer:\n  peerDiscovery: {pluginRef: peers}\n"
    + "  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]\n"
)


def _slice(pod: str, port: int) -> dict[str, object]:
    """The EPP Service's EndpointSlice for one replica (its own port: both run on loopback)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": pod, "namespace": NS, "labels": {"kubernetes.io/service-name": "epp"}},
        "addressType": "IPv4",
        "ports": [{"name": "peer", "port": port}],
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod},
            }
        ],
    }


async def _connected(http: aiohttp.ClientSession, epp: EppProcess) -> bool:
    return _value(await _metrics(http, epp), 'epp_sync_peers{state="connected"}') == 1


def _epp_pod(
    c: Cluster, tmp: pathlib.Path, site: pathlib.Path, pod_name: str, *args: str, health: str = "readiness"
) -> EppProcess:
    """An EPP pod of the test cluster's pool, with ``tmp``'s config and ``site``'s plugins."""
    return EppProcess(
        "--pool-name=pool",
        f"--pool-namespace={NS}",
        f"--kubeconfig={c.kubeconfig}",
        "--bind-address=127.0.0.1",
        QUICK_STOP,
        f"--config-file={tmp / 'config.yaml'}",
        *args,
        env={"POD_NAME": pod_name, "NAMESPACE": NS, "PYTHONPATH": str(site)},
        health_service=health,
    )


async def test_peers_found_from_the_services_endpointslices(tmp_path: pathlib.Path) -> None:
    """No --peers: each replica finds the other in the EPP Service's EndpointSlices and syncs."""
    async with cluster(tmp_path, 2) as c:
        c.api.register(SLICES)
        (tmp_path / "config.yaml").write_text(DISCOVERY_CONFIG)
        site = _plugin_site(tmp_path)
        replicas = []
        for name in ("a", "b"):
            port = free_port_pair()
            pod_name = f"epp-7d9f8b6c5d-{name}"
            c.api.create(_slice(pod_name, port))
            replicas.append(_epp_pod(c, tmp_path, site, pod_name, f"--peer-port={port}"))
        a, b = replicas
        async with both_serving(a, b):
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
            )
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                await _route_until_received(http, proxy.url, a, b)
                # the gauge follows on each hub's next liveness tick (~0.1 s)
                await until_async(lambda: _connected(http, a), 5, what="a counts its peer connected")
                await until_async(lambda: _connected(http, b), 5, what="b counts its peer connected")


async def _sync_state(url: str, unix: pathlib.Path | None = None) -> dict[str, Any]:
    connector = aiohttp.UnixConnector(path=str(unix)) if unix is not None else None
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as r:
        doc: dict[str, Any] = await r.json()
    state: dict[str, Any] = doc["sync"]
    return state


async def test_every_worker_of_every_pod_hears_every_other(tmp_path: pathlib.Path) -> None:
    """Two pods found in the EPP Service's EndpointSlices, each running ``--workers 2``: each pod's
    slice lists only its own peer port, and a pod stands for its workers (that port + 2j), so each
    of the four workers applies batches from the three others, through a real Envoy with two
    threads (whose connections the workers of each pod split between them)."""
    async with cluster(tmp_path, 2) as c:
        c.api.register(SLICES)
        (tmp_path / "config.yaml").write_text(DISCOVERY_CONFIG)
        site = _plugin_site(tmp_path)
        pods: dict[str, EppProcess] = {}
        for name in ("a", "b"):
            port = free_port_run(4)  # two ports a worker
            pod_name = f"epp-7d9f8b6c5d-{name}"
            c.api.create(_slice(pod_name, port))
            pods[pod_name] = _epp_pod(c, tmp_path, site, pod_name, f"--peer-port={port}", "--workers=2")
        a, b = pods.values()
        async with both_serving(a, b):
            await asyncio.gather(_all_up(a, 2), _all_up(b, 2))
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
                concurrency=2,
            )
            workers = {f"{pod}-w{i}" for pod in pods for i in (0, 1)}
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:

                async def all_heard() -> bool:
                    results = await asyncio.gather(*(complete(http, proxy.url, f"p{i}") for i in range(20)))
                    assert all(status == 200 for status, _ in results)
                    for pod, epp in pods.items():
                        states = [
                            await _sync_state(f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state"),
                            await _sync_state(
                                "http://worker1/debug/plugins/state",
                                _run_dir(_children(epp.pid)[1]) / "w1.metrics.sock",
                            ),
                        ]
                        for i, st in enumerate(states):
                            others = workers - {f"{pod}-w{i}"}
                            heard = {o for o, p in st["peers"].items() if p["lastSeq"] and not p["silent"]}
                            assert st["replicaId"] == f"{pod}-w{i}"
                            if heard != others:
                                return False
                    return True

                await until_async(all_heard, 30, what="every worker applied batches from the three others")
