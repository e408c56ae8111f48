"""Authentication, TokenReview/SubjectAccessReview answers, and injected faults as the client sees them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from epp_kubeapi import KubeApiServer, UserInfo

from .conftest import connect, pod, read_event

PROM = "system:serviceaccount:monitoring:prometheus"


async def test_requests_without_a_known_token_are_401(server: KubeApiServer, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/api/v1/pods") as resp:
        assert resp.status == 401
        body = await resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
    cfg = client.Configuration(
        host=server.url, api_key={"BearerToken": "nope"}, api_key_prefix={"BearerToken": "Bearer"}
    )
    async with client.ApiClient(cfg) as anonymous:
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(anonymous).list_pod_for_all_namespaces()
    assert exc.value.status == 401
    assert server.requests[-1].username is None


async def test_token_review(server: KubeApiServer, api: client.ApiClient) -> None:
    server.add_token(
        "prom-token", UserInfo(PROM, ("system:serviceaccounts", "system:authenticated"), uid="u1")
    )
    authn = client.AuthenticationV1Api(api)
    known = await authn.create_token_review({"spec": {"token": "prom-token"}})
    assert known.status.authenticated
    assert (known.status.user.username, known.status.user.uid) == (PROM, "u1")
    assert known.status.user.groups == ["system:serviceaccounts", "system:authenticated"]
    unknown = await authn.create_token_review({"spec": {"token": "forged"}})
    assert not unknown.status.authenticated
    with pytest.raises(ApiException) as exc:  # review APIs are create-only
        await api.call_api(
            "/apis/authentication.k8s.io/v1/tokenreviews", "GET", auth_settings=["BearerToken"]
        )
    assert exc.value.status == 405


async def test_subject_access_review(server: KubeApiServer, api: client.ApiClient) -> None:
    server.allow(PROM, verb="get", path="/metrics")
    server.allow("system:serviceaccounts", verb="get", path="/debug/*")
    server.allow("system:serviceaccount:default:epp", verb="list", resource="pods", namespace="default")
    authz = client.AuthorizationV1Api(api)

    async def allowed(user: str, groups: list[str], **attrs: object) -> bool:
        review = await authz.create_subject_access_review({"spec": {"user": user, "groups": groups, **attrs}})
        return bool(review.status.allowed)

    metrics = {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    assert await allowed(PROM, [], **metrics)
    assert not await allowed("system:serviceaccount:default:other", ["system:authenticated"], **metrics)
    assert not await allowed(PROM, [], nonResourceAttributes={"path": "/metrics", "verb": "post"})
    assert await allowed(
        "x", ["system:serviceaccounts"], nonResourceAttributes={"path": "/debug/pprof", "verb": "get"}
    )
    assert await allowed("anyone", ["system:masters"], **metrics)
    pods = {"namespace": "default", "verb": "list", "resource": "pods"}
    assert await allowed("system:serviceaccount:default:epp", [], resourceAttributes=pods)
    assert not await allowed(
        "system:serviceaccount:default:epp", [], resourceAttributes=dict(pods, namespace="kube-system")
    )
    with pytest.raises(ApiException) as exc:
        await authz.create_subject_access_review({"spec": {"user": PROM}})
    assert exc.value.status == 422


async def test_fail_next_answers_the_injected_status_then_recovers(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    server.fail_next(2, status=500, path_contains="/pods")
    await client.CoordinationV1Api(api).list_namespaced_lease("default")  # not matched, not counted
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            await core.list_namespaced_pod("default")
        assert exc.value.status == 500
        assert json.loads(exc.value.body)["reason"] == "InternalError"
    await core.list_namespaced_pod("default")
    server.fail_next(2, status=429, path_contains="watch=")
    async with await core.list_namespaced_pod("default", watch=True, _preload_content=False) as raw:
        assert raw.status == 429  # raw responses are not checked by the client
    async with watch.Watch() as w:
        with pytest.raises(ApiException) as throttled:
            await anext(w.stream(core.list_namespaced_pod, "default", timeout_seconds=5))
    assert throttled.value.status == 429


async def test_down_answers_503_and_drops_watches(server: KubeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    server.create(pod("a"))
    async with await core.list_namespaced_pod("default", watch=True, _preload_content=False) as resp:
        assert (await read_event(resp))["type"] == "ADDED"
        server.down = True
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.content.read(), 5)
    with pytest.raises(ApiException) as exc:
        await core.read_namespaced_pod("a", "default")
    assert exc.value.status == 503
    assert json.loads(exc.value.body)["reason"] == "ServiceUnavailable"
    server.down = False
    assert (await core.read_namespaced_pod("a", "default")).metadata.name == "a"


async def test_requests_are_recorded_with_the_authenticated_user(
    server: KubeApiServer, tmp_path: Path
) -> None:
    server.add_token("epp-token", UserInfo("system:serviceaccount:default:epp"))
    async with connect(server, tmp_path, token="epp-token") as epp:
        await client.CoreV1Api(epp).list_namespaced_pod("default", label_selector="app=vllm")
    last = server.requests[-1]
    assert (last.method, last.path, last.username) == (
        "GET",
        "/api/v1/namespaces/default/pods",
        "system:serviceaccount:default:epp",
    )
    assert last.query["labelSelector"] == "app=vllm"
