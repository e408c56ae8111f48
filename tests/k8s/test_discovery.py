"""KubernetesDiscovery against an API server: the datastore follows the pool, its pods and objectives."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from epp.datalayer.api import GroupVersionKind, NotificationEvent
from epp.datastore.store import Datastore
from epp.k8s.client import Kube
from epp.k8s.discovery import DiscoverySpec, KubernetesDiscovery
from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer, Resource
from epp_kubeapi.objects import inference_pool, pod

X = "inference.networking.x-k8s.io/v1alpha2"


@contextlib.asynccontextmanager
async def discovering(
    kube: Kube, spec: DiscoverySpec, **kw: Any
) -> AsyncIterator[tuple[Datastore, KubernetesDiscovery]]:
    ds = Datastore()
    d = KubernetesDiscovery(kube, ds, spec, **kw)
    async with d:
        yield ds, d


def eps(ds: Datastore) -> dict[str, str]:
    return {e.name: e.metadata.hostport for e in ds.endpoints()}


POOL = DiscoverySpec(namespace="default", pool_name="pool")


def objective(name: str, priority: int, pool: str = "pool") -> dict[str, Any]:
    return {
        "apiVersion": X,
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "poolRef": {"name": pool}},
    }


async def test_pool_mode_follows_pods_and_pool(api: KubeApiServer, kube: Kube) -> None:
    api.create(inference_pool(ports=(8000, 8001)))
    api.create(inference_pool("other-pool", ports=(7000,)))
    api.create(pod("a", "10.0.0.1"))
    async with discovering(kube, POOL) as (ds, _):
        await until(lambda: ds.pool_synced)
        assert eps(ds) == {"a-rank-0": "10.0.0.1:8000", "a-rank-1": "10.0.0.1:8001"}
        assert ds.pool is not None and ds.pool.name == "pool"
        api.create(pod("b", "10.0.0.2", annotations={"inference.networking.k8s.io/active-ports": "8001"}))
        await until(lambda: "b-rank-1" in eps(ds))
        assert "b-rank-0" not in eps(ds)
        api.patch(
            "v1", "Pod", "default", "a", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        )
        await until(lambda: "a-rank-0" not in eps(ds))
        api.patch(
            "inference.networking.k8s.io/v1",
            "InferencePool",
            "default",
            "pool",
            {"spec": {"targetPorts": [{"number": 9000}]}},
        )
        await until(lambda: eps(ds) == {"b-rank-0": "10.0.0.2:9000"} or eps(ds) == {})
        # the annotation names 8001 only, which is no longer a target port
        assert eps(ds) == {}
        api.delete("inference.networking.k8s.io/v1", "InferencePool", "default", "pool")
        await until(lambda: ds.pool is None)
        assert not ds.pool_synced


async def test_objectives_and_rewrites_from_crds(api: KubeApiServer, kube: Kube) -> None:
    api.create(inference_pool())
    api.create(objective("chat", 7))
    api.create(objective("theirs", 9, pool="other"))
    async with discovering(kube, POOL) as (ds, d):
        await until(lambda: ds.objective("chat") is not None)
        assert ds.objective("theirs") is None
        api.create(
            {
                "apiVersion": X,
                "kind": "InferenceModelRewrite",
                "metadata": {"name": "rw", "namespace": "default"},
                "spec": {"poolRef": {"name": "pool"}, "rules": [{"targets": [{"modelRewrite": "llama-v2"}]}]},
            }
        )
        await until(lambda: len(ds.rewrites) == 1)
        api.delete(X, "InferenceObjective", "default", "chat")
        await until(lambda: ds.objective("chat") is None)
        assert d.missing_kinds == []


async def test_pool_recreated_restores_objectives(api: KubeApiServer, kube: Kube) -> None:
    api.create(inference_pool())
    api.create(objective("chat", 7))
    async with discovering(kube, POOL) as (ds, _):
        await until(lambda: ds.objective("chat") is not None)
        api.delete("inference.networking.k8s.io/v1", "InferencePool", "default", "pool")
        await until(lambda: ds.objective("chat") is None)
        api.create(inference_pool())
        await until(lambda: ds.objective("chat") is not None)


async def test_missing_objective_crds_are_not_fatal(kube: Kube, tmp_path: Any) -> None:
    server = KubeApiServer(bookmark_interval=0.2)
    server.register_inference_crds(objectives=False)
    async with server:
        k = await Kube.connect(str(server.write_kubeconfig(tmp_path / "kc")), {})
        try:
            server.create(inference_pool())
            server.create(pod("a"))
            async with discovering(k, POOL) as (ds, d):
                await until(lambda: ds.pool_synced and len(d.missing_kinds) == 2)
                assert set(d.missing_kinds) == {"InferenceObjective", "InferenceModelRewrite"}
                assert eps(ds) == {"a-rank-0": "10.0.0.1:8000"}
        finally:
            await k.close()


async def test_x_k8s_pool_group(api: KubeApiServer, kube: Kube) -> None:
    api.create(
        {
            "apiVersion": X,
            "kind": "InferencePool",
            "metadata": {"name": "pool", "namespace": "default"},
            "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000},
        }
    )
    api.create(pod("a"))
    spec = DiscoverySpec(namespace="default", pool_name="pool", pool_group="inference.networking.x-k8s.io")
    async with discovering(kube, spec) as (ds, _):
        await until(lambda: ds.pool_synced)
        assert eps(ds) == {"a-rank-0": "10.0.0.1:8000"}


async def test_standalone_mode_needs_no_pool(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("a", labels={"app": "vllm", "tier": "gold"}))
    api.create(pod("b", "10.0.0.2", labels={"app": "vllm"}))
    spec = DiscoverySpec(
        namespace="default",
        selector={"app": "vllm", "tier": "gold"},
        target_ports=(8000,),
        standalone_name="epp",
    )
    async with discovering(kube, spec) as (ds, _):
        await until(lambda: ds.pool_synced)
        assert eps(ds) == {"a-rank-0": "10.0.0.1:8000"}
        assert ds.pool is not None and ds.pool.name == "epp"
        pod_requests = [r for r in api.requests if r.path.endswith("/pods")]
        assert all(r.query.get("labelSelector") == "app=vllm,tier=gold" for r in pod_requests)
        assert not any("inferencepools" in r.path for r in api.requests)


async def test_relist_after_outage_does_not_flap_unchanged_endpoints(api: KubeApiServer, kube: Kube) -> None:
    api.create(inference_pool())
    api.create(pod("a", "10.0.0.1"))
    api.create(pod("b", "10.0.0.2"))
    from tests.k8s.test_pool import Events

    async with discovering(kube, POOL) as (ds, d):
        await until(lambda: len(eps(ds)) == 2)
        ev = Events()
        ds.add_observer(ev)
        ev.log.clear()
        api.down = True
        api.delete("v1", "Pod", "default", "b")
        api.create(pod("c", "10.0.0.3"))
        api.compact()
        assert len(eps(ds)) == 2  # routing goes on with what we knew
        api.down = False
        await until(lambda: set(eps(ds)) == {"a-rank-0", "c-rank-0"})
        assert sorted(ev.log) == [("+", "c-rank-0"), ("-", "b-rank-0")]
        assert d.reflectors["pods"].lists >= 2


class Subscriber:
    def __init__(self) -> None:
        self.gvk = GroupVersionKind("", "v1", "ConfigMap")
        self.typed_name = "k8s-notification-source/cm"
        self.events: list[NotificationEvent] = []

    def notify(self, event: NotificationEvent) -> None:
        self.events.append(event)


async def test_notification_sources_get_their_kind(api: KubeApiServer, kube: Kube) -> None:
    api.register(Resource(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True))
    api.create(inference_pool())
    sub = Subscriber()
    async with discovering(kube, POOL, notification_sources=[sub]):
        api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cfg", "namespace": "default"},
                "data": {},
            }
        )
        await until(lambda: len(sub.events) == 1)
        api.delete("v1", "ConfigMap", "default", "cfg")
        await until(lambda: len(sub.events) == 2)
    assert [(e.type, e.name, e.object is None) for e in sub.events] == [
        ("AddOrUpdate", "cfg", False),
        ("Delete", "cfg", True),
    ]
