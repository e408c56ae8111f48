"""CRUD, conflicts, discovery and list semantics, through the unmodified kubernetes_asyncio client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from epp_kubeapi import AlreadyExists, Conflict, KubeApiServer, NotFound, Resource

from .conftest import connect, pod, pool

MERGE = "application/merge-patch+json"
INF, INF_X = "inference.networking.k8s.io", "inference.networking.x-k8s.io"


def status_of(exc: ApiException) -> dict[str, object]:
    body: dict[str, object] = json.loads(exc.body)
    return body


async def test_pod_lifecycle_bumps_one_global_resource_version(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_pod("default", pod("p1", labels={"app": "vllm"}))
    rv1 = int(created.metadata.resource_version)
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.status.phase == "Pending"  # a client's create cannot set status
    got = await core.read_namespaced_pod("p1", "default")
    assert got.metadata.resource_version == str(rv1)

    lease = await client.CoordinationV1Api(api).create_namespaced_lease(
        "default", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    )
    assert int(lease.metadata.resource_version) == rv1 + 1  # one counter across resources

    patched = await core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"role": "x"}}})
    assert patched.metadata.labels == {"app": "vllm", "role": "x"}
    assert int(patched.metadata.resource_version) == rv1 + 2
    assert patched.metadata.generation == 1  # metadata-only change

    listed = await core.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["p1"]
    assert listed.metadata.resource_version == str(server.resource_version)

    deleted = await core.delete_namespaced_pod("p1", "default")
    assert int(deleted.metadata.resource_version) == rv1 + 3
    with pytest.raises(ApiException) as exc:
        await core.read_namespaced_pod("p1", "default")
    assert exc.value.status == 404
    assert status_of(exc.value) | {"details": None} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p1" not found',
        "reason": "NotFound",
        "code": 404,
        "details": None,
    }


async def test_duplicate_create_is_409_already_exists(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(ApiException) as exc:
        await core.create_namespaced_pod("default", pod("p1"))
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "AlreadyExists"


async def test_lease_update_with_stale_resource_version_is_409_conflict(api: client.ApiClient) -> None:
    """Two candidates read the same Lease; the second write loses, as leader election relies on."""
    leases = client.CoordinationV1Api(api)
    await leases.create_namespaced_lease(
        "default", {"metadata": {"name": "epp"}, "spec": {"holderIdentity": ""}}
    )
    a = await leases.read_namespaced_lease("epp", "default")
    b = await leases.read_namespaced_lease("epp", "default")
    a.spec.holder_identity = "a"
    won = await leases.replace_namespaced_lease("epp", "default", a)
    assert won.spec.holder_identity == "a"
    assert int(won.metadata.resource_version) > int(b.metadata.resource_version)
    b.spec.holder_identity = "b"
    with pytest.raises(ApiException) as exc:
        await leases.replace_namespaced_lease("epp", "default", b)
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "Conflict"
    assert (await leases.read_namespaced_lease("epp", "default")).spec.holder_identity == "a"
    with pytest.raises(ApiException) as missing:
        await leases.replace_namespaced_lease("gone", "default", {"metadata": {"name": "gone"}})
    assert missing.value.status == 404


async def test_noop_update_keeps_the_resource_version(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    created = await leases.create_namespaced_lease("default", {"metadata": {"name": "l"}, "spec": {}})
    same = await leases.replace_namespaced_lease("l", "default", created)
    assert same.metadata.resource_version == created.metadata.resource_version


async def test_custom_objects_and_the_status_subresource(api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    created = await co.create_namespaced_custom_object(INF, "v1", "default", "inferencepools", pool("p"))
    assert created["kind"] == "InferencePool" and created["metadata"]["generation"] == 1
    spec = {"spec": {"targetPorts": [{"number": 9000}]}}
    patched = await co.patch_namespaced_custom_object(
        INF, "v1", "default", "inferencepools", "p", spec, _content_type=MERGE
    )
    assert patched["spec"]["targetPorts"] == [{"number": 9000}] and patched["metadata"]["generation"] == 2

    status = {"status": {"parents": [{"parentRef": {"name": "gw"}}]}}
    ignored = await co.patch_namespaced_custom_object(
        INF, "v1", "default", "inferencepools", "p", status, _content_type=MERGE
    )
    assert "status" not in ignored  # the main resource ignores status, as with a status subresource
    written = await co.patch_namespaced_custom_object_status(
        INF, "v1", "default", "inferencepools", "p", status, _content_type=MERGE
    )
    assert written["status"] == status["status"] and written["metadata"]["generation"] == 2

    ops = [{"op": "replace", "path": "/spec/targetPorts/0/number", "value": 8001}]
    jp = await co.patch_namespaced_custom_object(INF, "v1", "default", "inferencepools", "p", ops)
    assert jp["spec"]["targetPorts"] == [{"number": 8001}]
    with pytest.raises(ApiException) as exc:  # a dict sent as json-patch, as the client does by default
        await co.patch_namespaced_custom_object(INF, "v1", "default", "inferencepools", "p", spec)
    assert exc.value.status == 400

    listed = await co.list_namespaced_custom_object(INF, "v1", "default", "inferencepools")
    assert listed["kind"] == "InferencePoolList" and [o["metadata"]["name"] for o in listed["items"]] == ["p"]
    everywhere = await co.list_cluster_custom_object(INF, "v1", "inferencepools")
    assert len(everywhere["items"]) == 1
    await co.delete_namespaced_custom_object(INF, "v1", "default", "inferencepools", "p")
    with pytest.raises(ApiException) as gone:
        await co.get_namespaced_custom_object(INF, "v1", "default", "inferencepools", "p")
    assert gone.value.status == 404


async def test_create_in_a_missing_namespace_is_404(api: client.ApiClient) -> None:
    with pytest.raises(ApiException) as exc:
        await client.CoreV1Api(api).create_namespaced_pod("nowhere", pod("p", namespace="nowhere"))
    assert exc.value.status == 404
    assert status_of(exc.value)["message"] == 'namespaces "nowhere" not found'


async def test_discovery_reports_exactly_the_registered_apis(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    assert (await client.CoreApi(api).get_api_versions()).versions == ["v1"]
    groups = {g.name: g for g in (await client.ApisApi(api).get_api_versions()).groups}
    assert {INF, INF_X, "coordination.k8s.io", "authentication.k8s.io"} <= groups.keys()
    assert groups[INF].preferred_version.group_version == f"{INF}/v1"
    co = client.CustomObjectsApi(api)
    names = {r["name"] for r in (await co.get_api_resources(INF_X, "v1alpha2")).to_dict()["resources"]}
    assert names >= {
        "inferencepools",
        "inferenceobjectives",
        "inferencemodelrewrites",
        "inferencepools/status",
    }
    core = {r.name: r for r in (await client.CoreV1Api(api).get_api_resources()).resources}
    assert core["pods"].namespaced and core["pods"].kind == "Pod"
    assert (await client.VersionApi(api).get_code()).major == "1"
    with pytest.raises(ApiException) as exc:
        await co.get_api_resources("example.com", "v1")
    assert exc.value.status == 404


async def test_a_cluster_without_the_objective_crds(tmp_path: Path) -> None:
    async with KubeApiServer() as bare, connect(bare, tmp_path) as api:
        co = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as no_crds:
            await co.get_api_resources(INF, "v1")
        assert no_crds.value.status == 404
        bare.register_inference_crds(objectives=False)
        names = {r["name"] for r in (await co.get_api_resources(INF_X, "v1alpha2")).to_dict()["resources"]}
        assert names == {"inferencepools", "inferencepools/status"}
        with pytest.raises(ApiException) as missing:
            await co.list_namespaced_custom_object(INF_X, "v1alpha2", "default", "inferenceobjectives")
        assert missing.value.status == 404

        bare.register(Resource("example.com", "v1", "widgets", "Widget", namespaced=False))
        widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        created = await co.create_cluster_custom_object("example.com", "v1", "widgets", widget)
        assert "namespace" not in created["metadata"]
        assert (await co.get_cluster_custom_object("example.com", "v1", "widgets", "w"))["kind"] == "Widget"


async def test_label_selectors_follow_the_apiserver_grammar(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    for name, labels in [
        ("a", {"app": "x", "tier": "1"}),
        ("b", {"app": "y", "tier": "5"}),
        ("c", {"other": "z"}),
    ]:
        await core.create_namespaced_pod("default", pod(name, labels=labels))
    cases = {
        "": "abc",
        "app=x": "a",
        "app==x": "a",
        "app!=x": "bc",
        "app in (x,y)": "ab",
        "app notin (x)": "bc",
        "app": "ab",
        "!app": "c",
        "app,tier in (5)": "b",
        "tier>2": "b",
        "tier<2": "a",
    }
    for selector, expected in cases.items():
        found = await core.list_namespaced_pod("default", label_selector=selector)
        assert "".join(p.metadata.name for p in found.items) == expected, selector
    with pytest.raises(ApiException) as exc:
        await core.list_namespaced_pod("default", label_selector="app in x")
    assert exc.value.status == 400


async def test_field_selectors(server: KubeApiServer, api: client.ApiClient) -> None:
    server.create(pod("a", ip="10.0.0.1"))
    server.create(pod("b", ip="10.0.0.2"))
    server.create(pod("c", namespace="other"))
    core = client.CoreV1Api(api)
    assert [
        p.metadata.name
        for p in (await core.list_pod_for_all_namespaces(field_selector="metadata.name=b")).items
    ] == ["b"]
    by_ip = await core.list_namespaced_pod("default", field_selector="status.podIP=10.0.0.1")
    assert [p.metadata.name for p in by_ip.items] == ["a"]
    not_default = await core.list_pod_for_all_namespaces(field_selector="metadata.namespace!=default")
    assert [p.metadata.name for p in not_default.items] == ["c"]
    with pytest.raises(ApiException) as exc:
        await core.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert exc.value.status == 400


async def test_pagination_with_limit_and_continue(server: KubeApiServer, api: client.ApiClient) -> None:
    for i in range(5):
        server.create(pod(f"p{i}"))
    core = client.CoreV1Api(api)
    first = await core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 3
    rest = await core.list_namespaced_pod("default", limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p2", "p3", "p4"] and not rest.metadata._continue
    server.create(pod("later"))
    server.compact()  # the token's resourceVersion is now older than the compaction point
    with pytest.raises(ApiException) as exc:
        await core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert exc.value.status == 410


def test_python_api_raises_like_the_server() -> None:
    srv = KubeApiServer()
    created = srv.create(pod("p", ip="10.0.0.9"))
    assert created["status"]["podIP"] == "10.0.0.9"  # the Python API acts with full (kubelet-like) access
    with pytest.raises(AlreadyExists):
        srv.create(pod("p"))
    stale = dict(created, metadata=dict(created["metadata"], resourceVersion="1"))
    with pytest.raises(Conflict):
        srv.update(stale)
    updated = srv.update(dict(created, spec={"containers": []}))
    assert updated["metadata"]["generation"] == 2
    patched = srv.patch("v1", "Pod", "default", "p", {"metadata": {"labels": {"a": "b"}}, "status": None})
    assert patched["metadata"]["labels"] == {"a": "b"} and "status" not in patched
    assert [o["metadata"]["name"] for o in srv.list("v1", "Pod")] == ["p"]
    srv.delete("v1", "Pod", "default", "p")
    assert srv.get("v1", "Pod", "default", "p") is None
    with pytest.raises(NotFound):
        srv.delete("v1", "Pod", "default", "p")
    srv.create(pod("q", namespace="fresh"))  # the namespace appears on demand
    assert srv.get("v1", "Namespace", None, "fresh") is not None


async def test_health_endpoints(server: KubeApiServer, api: client.ApiClient) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        resp = await api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False)
        async with resp:
            assert (resp.status, await resp.text()) == (200, "ok")


async def test_delete_preconditions_and_status_answers(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    created = await leases.create_namespaced_lease("default", {"metadata": {"name": "l"}, "spec": {}})
    await leases.patch_namespaced_lease("l", "default", {"spec": {"holderIdentity": "a"}})
    stale = {"preconditions": {"resourceVersion": created.metadata.resource_version}}
    with pytest.raises(ApiException) as exc:
        await leases.delete_namespaced_lease("l", "default", body=stale)
    assert exc.value.status == 409
    done = await leases.delete_namespaced_lease("l", "default")
    assert (done.kind, done.status, done.details.name) == ("Status", "Success", "l")
    with pytest.raises(ApiException) as gone:
        await leases.delete_namespaced_lease("l", "default")
    assert gone.value.status == 404
