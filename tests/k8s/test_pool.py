"""Pool + Pod objects → datastore endpoints (GIE §7.2-§7.4), driven through the reflector handlers."""

from __future__ import annotations

import pytest

from epp.datalayer.api import Endpoint, EndpointObserver
from epp.datastore.store import Datastore
from epp.k8s.pool import PoolEndpoints, PoolObject, PoolSpecError, pod_endpoints, pool_from_object
from epp_kubeapi.objects import inference_pool, pod


class Events(EndpointObserver):
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def endpoint_added(self, endpoint: Endpoint) -> None:
        self.log.append(("+", endpoint.name))

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.log.append(("-", endpoint.name))


def setup() -> tuple[Datastore, PoolEndpoints, PoolObject, Events]:
    ds = Datastore()
    ev = Events()
    ds.add_observer(ev)
    eps = PoolEndpoints(ds)
    return ds, eps, PoolObject(eps), ev


def hostports(ds: Datastore) -> dict[str, str]:
    return {e.name: e.metadata.hostport for e in ds.endpoints()}


def test_v1_pool_fields() -> None:
    info = pool_from_object(inference_pool(ports=(8000, 8001), app_protocol="kubernetes.io/h2c"))
    assert info.target_ports == (8000, 8001)
    assert dict(info.selector) == {"app": "vllm"}
    assert info.app_protocol == "kubernetes.io/h2c"
    assert pool_from_object(inference_pool()).app_protocol == "http"


def test_v1alpha2_pool_shape() -> None:
    obj = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"selector": {"app": "x"}, "targetPortNumber": 8000},
    }
    info = pool_from_object(obj)
    assert (info.target_ports, dict(info.selector), info.namespace) == ((8000,), {"app": "x"}, "ns")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}, "spec.selector.matchLabels"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []}, "spec.targetPorts"),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": p} for p in range(1, 10)]},
            "spec.targetPorts",
        ),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 1}, {"number": 1}]}, "unique"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}, "invalid port"),
    ],
)
def test_invalid_pool_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(PoolSpecError, match=field):
        pool_from_object({"metadata": {"name": "p"}, "spec": spec})


def test_ranks_and_active_ports_annotation() -> None:
    pool = pool_from_object(inference_pool(ports=(8000, 8001, 8002)))
    names = [m.name for m in pod_endpoints(pod("p1"), pool)]
    assert names == ["p1-rank-0", "p1-rank-1", "p1-rank-2"]
    narrowed = pod_endpoints(
        pod("p1", annotations={"inference.networking.k8s.io/active-ports": "8002, 8000,x,9"}), pool
    )
    assert [(m.name, m.port) for m in narrowed] == [("p1-rank-0", 8000), ("p1-rank-2", 8002)]


def test_llm_d_active_ports_annotation_and_precedence() -> None:
    """llm-d-router's ``llm-d.ai/active-ports`` narrows ranks too; with both keys GIE's wins."""
    pool = pool_from_object(inference_pool(ports=(8000, 8001, 8002)))
    llmd = pod_endpoints(pod("p1", annotations={"llm-d.ai/active-ports": "8001"}), pool)
    assert [(m.name, m.port) for m in llmd] == [("p1-rank-1", 8001)]
    both = pod_endpoints(
        pod(
            "p1",
            annotations={"inference.networking.k8s.io/active-ports": "8000", "llm-d.ai/active-ports": "8001"},
        ),
        pool,
    )
    assert [(m.name, m.port) for m in both] == [("p1-rank-0", 8000)]
    # An empty GIE annotation still counts as "set": every port, not the llm-d list.
    empty = pod_endpoints(
        pod(
            "p1",
            annotations={"inference.networking.k8s.io/active-ports": "", "llm-d.ai/active-ports": "8001"},
        ),
        pool,
    )
    assert [m.port for m in empty] == [8000, 8001, 8002]


@pytest.mark.parametrize(
    "obj",
    [
        pod("p", ready=False),
        pod("p", deleting=True),
        pod("p", ip=""),  # evicted: IP cleared
        pod("p", labels={"app": "other"}),
    ],
    ids=["unready", "deleting", "no-ip", "labels-do-not-match"],
)
def test_pods_that_do_not_serve(obj: dict[str, object]) -> None:
    assert pod_endpoints(obj, pool_from_object(inference_pool())) == []


def test_metrics_port_flag_only_with_one_target_port() -> None:
    one = pool_from_object(inference_pool(ports=(8000,)))
    two = pool_from_object(inference_pool(ports=(8000, 8001)))
    assert pod_endpoints(pod("p"), one, 9100)[0].metrics_host == "10.0.0.1:9100"
    assert {m.metrics_host for m in pod_endpoints(pod("p"), two, 9100)} == {"10.0.0.1:8000", "10.0.0.1:8001"}


def test_pods_before_pool_wait_then_sync() -> None:
    ds, eps, pool, _ = setup()
    eps.upsert(pod("a", "10.0.0.1"))
    eps.synced()
    assert ds.endpoints() == () and not ds.pool_synced
    pool.upsert(inference_pool())
    assert hostports(ds) == {"a-rank-0": "10.0.0.1:8000"}
    assert ds.pool_synced


def test_unchanged_pod_update_does_not_flap() -> None:
    _ds, eps, pool, ev = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a", rv="1"))
    eps.upsert(pod("a", rv="2"))  # e.g. a status heartbeat: same endpoints
    assert ev.log == [("+", "a-rank-0")]


def test_pod_turning_unready_then_ready() -> None:
    ds, eps, pool, ev = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a"))
    eps.upsert(pod("a", ready=False))
    assert ds.endpoints() == ()
    eps.upsert(pod("a"))
    assert ev.log == [("+", "a-rank-0"), ("-", "a-rank-0"), ("+", "a-rank-0")]


def test_pod_moving_ip_replaces_endpoint() -> None:
    ds, eps, pool, _ = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a", "10.0.0.1"))
    eps.upsert(pod("a", "10.0.0.9"))
    assert hostports(ds) == {"a-rank-0": "10.0.0.9:8000"}


def test_selector_and_port_change_resyncs_every_pod() -> None:
    ds, eps, pool, _ = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a", "10.0.0.1", labels={"app": "vllm"}))
    eps.upsert(pod("b", "10.0.0.2", labels={"app": "sglang"}))
    assert set(hostports(ds)) == {"a-rank-0"}
    pool.upsert(inference_pool(selector={"app": "sglang"}, ports=(9000, 9001)))
    assert hostports(ds) == {"b-rank-0": "10.0.0.2:9000", "b-rank-1": "10.0.0.2:9001"}


def test_pool_deleted_clears_everything_and_recreated_restores() -> None:
    ds, eps, pool, _ = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a"))
    eps.synced()
    pool.delete(inference_pool())
    assert ds.endpoints() == () and ds.pool is None and not ds.pool_synced
    pool.upsert(inference_pool())
    assert set(hostports(ds)) == {"a-rank-0"} and ds.pool_synced


def test_invalid_pool_update_keeps_last_valid() -> None:
    ds, eps, pool, _ = setup()
    pool.upsert(inference_pool())
    eps.upsert(pod("a"))
    bad = inference_pool()
    bad["spec"]["targetPorts"] = []
    pool.upsert(bad)
    assert "spec.targetPorts" in pool.error
    assert set(hostports(ds)) == {"a-rank-0"}


def test_pod_delete_removes_all_ranks() -> None:
    ds, eps, pool, _ = setup()
    pool.upsert(inference_pool(ports=(8000, 8001)))
    eps.upsert(pod("a"))
    eps.upsert(pod("b", "10.0.0.2"))
    eps.delete(pod("a"))
    assert set(hostports(ds)) == {"b-rank-0", "b-rank-1"}


def test_pod_labels_reach_endpoints_for_the_pd_role_filters() -> None:
    """P/D roles come from pod labels (llm-d.ai/role): every rank of the pod carries them."""
    pool = pool_from_object(inference_pool(ports=(8000, 8001)))
    labels = {"app": "vllm", "llm-d.ai/role": "prefill"}
    assert [m.labels for m in pod_endpoints(pod("p1", labels=labels), pool)] == [labels, labels]


def test_node_address_is_the_pods_host_ip() -> None:
    """``status.hostIP`` is where a node-level exporter (dcgm-data-source ``useNodeAddress``) listens."""
    info = pool_from_object(inference_pool())
    on_node = pod("p1")
    on_node["status"]["hostIP"] = "192.168.0.4"
    (md,) = pod_endpoints(on_node, info)
    assert (md.address, md.node_address) == ("10.0.0.1", "192.168.0.4")
    (unknown,) = pod_endpoints(pod("p2"), info)
    assert unknown.node_address == ""
