"""Peers from Kubernetes (epp.k8s.peers): EndpointSlices or pods of the EPP, against the test API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.errors import ConfigError
from epp.k8s.client import Kube
from epp.k8s.peers import K8sPeerDiscovery, K8sPeerDiscoveryParams, KubernetesPeers, PeerDiscoverySpec
from epp.sync.peers import Peer
from epp.testing.plugins import FakeHandle
from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer, Resource
from epp_kubeapi.objects import pod

SLICES = Resource(group="discovery.k8s.io", version="v1", plural="endpointslices", kind="EndpointSlice")
SPEC = PeerDiscoverySpec(namespace="default", service="epp", self_ip="10.0.0.1", self_name="epp-a")


def endpoint_slice(
    name: str, *endpoints: tuple[str, str, bool], service: str = "epp", port: str = "peer"
) -> Any:
    """An EndpointSlice of ``service``: (pod name, IP, ready) per endpoint, ports grpc 9002 and ``port`` 5557."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 9002}, {"name": port, "port": 5557}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready}, "targetRef": {"kind": "Pod", "name": n}}
            for n, ip, ready in endpoints
        ],
    }


def peers(*names: str) -> frozenset[Peer]:
    ips = {"epp-b": "10.0.0.2", "epp-c": "10.0.0.3", "epp-d": "10.0.0.4"}
    return frozenset(Peer(n, ips[n], 5557) for n in names)


@pytest.fixture
async def slices(api: KubeApiServer, kube: Kube) -> AsyncIterator[KubernetesPeers]:
    api.register(SLICES)
    async with KubernetesPeers(kube, SPEC) as p:
        yield p


async def test_peer_set_follows_slices_ready_only_and_not_itself(
    api: KubeApiServer, slices: KubernetesPeers
) -> None:
    api.create(endpoint_slice("epp-1", ("epp-a", "10.0.0.1", True), ("epp-b", "10.0.0.2", True)))
    api.create(endpoint_slice("other", ("x", "10.9.9.9", True), service="not-epp"))  # another Service
    await until(lambda: slices.current == peers("epp-b"), what="itself left out")
    api.create(endpoint_slice("epp-2", ("epp-c", "10.0.0.3", False)))
    api.update(endpoint_slice("epp-1", ("epp-a", "10.0.0.1", True), ("epp-b", "10.0.0.2", True)))
    await until(lambda: "default/epp-2" in slices.reflector.store, what="slice seen")
    assert slices.current == peers("epp-b")  # epp-c is not ready yet
    api.update(endpoint_slice("epp-2", ("epp-c", "10.0.0.3", True)))
    await until(lambda: slices.current == peers("epp-b", "epp-c"), what="epp-c ready")
    api.update(endpoint_slice("epp-1", ("epp-a", "10.0.0.1", True), ("epp-b", "10.0.0.2", False)))
    await until(lambda: slices.current == peers("epp-c"), what="epp-b not ready")
    api.delete("discovery.k8s.io/v1", "EndpointSlice", "default", "epp-2")
    await until(lambda: slices.current == frozenset(), what="slice gone")


async def test_a_slice_without_the_named_port_gives_no_peers(
    api: KubeApiServer, slices: KubernetesPeers
) -> None:
    api.create(endpoint_slice("epp-1", ("epp-b", "10.0.0.2", True), port="metrics"))
    await until(lambda: "default/epp-1" in slices.reflector.store, what="slice seen")
    assert slices.current == frozenset()


async def test_outage_keeps_the_last_set_and_recovers(api: KubeApiServer, slices: KubernetesPeers) -> None:
    api.create(endpoint_slice("epp-1", ("epp-b", "10.0.0.2", True)))
    await until(lambda: slices.current == peers("epp-b"), what="first set")
    lists = slices.reflector.lists
    api.down = True
    api.delete("discovery.k8s.io/v1", "EndpointSlice", "default", "epp-1")
    api.create(endpoint_slice("epp-2", ("epp-c", "10.0.0.3", True), ("epp-d", "10.0.0.4", True)))
    api.compact()
    await until(lambda: slices.reflector.errors > 0, what="the outage noticed")
    assert slices.current == peers("epp-b")  # syncing goes on with the peers we knew
    api.down = False
    await until(lambda: slices.current == peers("epp-c", "epp-d"), timeout=30, what="recovered")
    assert slices.reflector.lists > lists


async def test_iterating_yields_each_new_set_once(api: KubeApiServer, slices: KubernetesPeers) -> None:
    seen: list[frozenset[Peer]] = []

    async def consume() -> None:
        async for s in slices.updates():
            seen.append(frozenset(s))

    task = asyncio.create_task(consume())
    try:
        await until(lambda: seen == [frozenset()], what="the first (empty) set after the list")
        api.create(endpoint_slice("epp-1", ("epp-b", "10.0.0.2", True)))
        await until(lambda: len(seen) == 2, what="a new set")
        api.update(endpoint_slice("epp-1", ("epp-b", "10.0.0.2", True), ("epp-a", "10.0.0.1", True)))
        api.create(endpoint_slice("epp-2", ("epp-c", "10.0.0.3", True)))
        await until(lambda: len(seen) == 3, what="epp-c")
        assert seen == [frozenset(), peers("epp-b"), peers("epp-b", "epp-c")]  # adding itself changed nothing
    finally:
        task.cancel()


def _epp_pod(name: str, ip: str, *, ready: bool = True, port: str = "peer") -> Any:
    obj = pod(name, ip, labels={"app": "epp"}, ready=ready)
    obj["spec"]["containers"] = [{"name": "epp", "ports": [{"name": port, "containerPort": 5557}]}]
    return obj


async def test_pods_by_selector(api: KubeApiServer, kube: Kube) -> None:
    spec = PeerDiscoverySpec(namespace="default", selector={"app": "epp"}, self_name="epp-a")
    api.create(_epp_pod("epp-a", "10.0.0.1"))
    api.create(_epp_pod("epp-b", "10.0.0.2"))
    api.create(_epp_pod("epp-c", "10.0.0.3", ready=False))
    api.create(_epp_pod("epp-d", "10.0.0.4", port="http"))
    api.create(pod("vllm", "10.1.0.1"))  # not an EPP
    async with KubernetesPeers(kube, spec) as p:
        await until(lambda: p.current == peers("epp-b"), what="ready EPP pods with the port")
        api.update(_epp_pod("epp-c", "10.0.0.3"))
        await until(lambda: p.current == peers("epp-b", "epp-c"), what="epp-c ready")


def test_plugin_params_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="exactly one of parameters service and selector"):
        K8sPeerDiscovery("", K8sPeerDiscoveryParams(), FakeHandle())
    params = K8sPeerDiscoveryParams.model_validate({"service": "epp", "portName": "sync"})
    plugin = K8sPeerDiscovery("", params, FakeHandle())
    spec = plugin.spec({"NAMESPACE": "ns", "POD_IP": "10.0.0.1", "POD_NAME": "epp-a"})
    assert spec == PeerDiscoverySpec(
        namespace="ns", service="epp", port_name="sync", self_ip="10.0.0.1", self_name="epp-a"
    )
