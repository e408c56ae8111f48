"""Watch semantics: resume from a resourceVersion, bookmarks, 410 after compaction, selector transitions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from epp_kubeapi import KubeApiServer

from .conftest import connect, pod, read_event, read_until_end

INF = "inference.networking.k8s.io"


async def test_watch_from_a_list_resource_version_sees_exactly_the_later_events(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    server.create(pod("before"))
    listed = await core.list_namespaced_pod("default")
    async with await core.list_namespaced_pod(
        "default", watch=True, resource_version=listed.metadata.resource_version, _preload_content=False
    ) as resp:
        await server.wait_for_watches(1)
        server.create(pod("p"))
        server.patch("v1", "Pod", "default", "p", {"metadata": {"labels": {"a": "1"}}})
        server.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}})
        server.delete("v1", "Pod", "default", "p")
        server.create(pod("marker"))
        events = [await read_event(resp) for _ in range(4)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "p"),
        ("MODIFIED", "p"),
        ("DELETED", "p"),
        ("ADDED", "marker"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[2] == rvs[1] + 2  # the lease write in between took one RV
    assert events[2]["object"]["metadata"]["labels"] == {"a": "1"}  # DELETED carries the last state
    assert events[0]["object"]["kind"] == "Pod" and events[0]["object"]["apiVersion"] == "v1"


async def test_resume_replays_history_written_while_disconnected(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    rv = server.resource_version
    server.create(pod("a"))
    server.create(pod("b"))
    core = client.CoreV1Api(api)
    async with await core.list_namespaced_pod(
        "default", watch=True, resource_version=str(rv), _preload_content=False
    ) as resp:
        names = [(await read_event(resp))["object"]["metadata"]["name"] for _ in range(2)]
    assert names == ["a", "b"]


async def test_watch_without_resource_version_starts_with_synthetic_added(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    server.create(pod("a"))
    server.create(pod("b", namespace="other"))
    async with watch.Watch() as w:
        stream = w.stream(client.CoreV1Api(api).list_pod_for_all_namespaces)
        first = [await anext(stream), await anext(stream)]
        assert {(e["type"], e["object"].metadata.name) for e in first} == {("ADDED", "a"), ("ADDED", "b")}
        server.create(pod("c"))
        live = await anext(stream)
        assert (live["type"], live["object"].metadata.name) == ("ADDED", "c")
        assert w.resource_version == str(server.resource_version)


async def test_bookmarks_carry_the_current_resource_version(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    async with await core.list_namespaced_pod(
        "default", watch=True, allow_watch_bookmarks=True, _preload_content=False
    ) as resp:
        await server.wait_for_watches(1)
        server.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}})
        want, seen = server.resource_version, 0
        while seen < want:  # a bookmark may have fallen due just before the lease write
            event = await read_event(resp)
            seen = int(event["object"]["metadata"]["resourceVersion"])
            assert seen <= want
    assert event == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(want), "creationTimestamp": None},
        },
    }


async def test_watch_client_tracks_bookmarks(server: KubeApiServer, api: client.ApiClient) -> None:
    server.create(pod("a"))
    async with watch.Watch() as w:
        stream = w.stream(client.CoreV1Api(api).list_namespaced_pod, "default", allow_watch_bookmarks=True)
        assert (await anext(stream))["type"] == "ADDED"
        server.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}})
        while w.resource_version != str(server.resource_version):
            assert (await anext(stream))["type"] == "BOOKMARK"


async def test_compaction_ends_open_watches_and_resumes_get_410(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    old = str(server.resource_version)
    server.create(pod("a"))
    async with await core.list_namespaced_pod(
        "default", watch=True, resource_version=old, _preload_content=False
    ) as resp:
        assert (await read_event(resp))["type"] == "ADDED"
        server.compact()
        events = await read_until_end(resp)
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"

    async with await core.list_namespaced_pod(
        "default", watch=True, resource_version=old, _preload_content=False
    ) as resp:
        assert resp.status == 200  # the real apiserver answers 200 and one ERROR event
        assert [e["object"]["code"] for e in await read_until_end(resp)] == [410]

    for kwargs in ({"timeout_seconds": 5}, {}):  # without a timeout the client retries once, then raises
        async with watch.Watch() as w:
            with pytest.raises(ApiException) as exc:
                async for _ in w.stream(core.list_namespaced_pod, "default", resource_version=old, **kwargs):
                    pass
        assert exc.value.status == 410

    fresh = await core.list_namespaced_pod("default")
    async with await core.list_namespaced_pod(
        "default", watch=True, resource_version=fresh.metadata.resource_version, _preload_content=False
    ) as resp:
        server.create(pod("b"))
        assert (await read_event(resp))["object"]["metadata"]["name"] == "b"


async def test_a_bounded_history_compacts_like_etcd(tmp_path: Path) -> None:
    async with KubeApiServer(history=3) as small, connect(small, tmp_path) as api:
        core = client.CoreV1Api(api)
        rv = small.resource_version
        for i in range(4):
            small.create(pod(f"p{i}"))
        async with await core.list_namespaced_pod(
            "default", watch=True, resource_version=str(rv + 1), _preload_content=False
        ) as resp:
            assert [(await read_event(resp))["object"]["metadata"]["name"] for _ in range(3)] == [
                "p1",
                "p2",
                "p3",
            ]
        async with await core.list_namespaced_pod(
            "default", watch=True, resource_version=str(rv), _preload_content=False
        ) as resp:
            assert [e["object"]["code"] for e in await read_until_end(resp)] == [410]


async def test_drop_watches_aborts_the_connection(server: KubeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    server.create(pod("a"))
    async with await core.list_namespaced_pod("default", watch=True, _preload_content=False) as resp:
        assert (await read_event(resp))["type"] == "ADDED"
        server.drop_watches()
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.content.read(), 5)
    await server.wait_for_watches(0)


async def test_selector_transitions_become_added_and_deleted(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    server.create(pod("p", labels={"app": "vllm"}))
    async with (
        await core.list_namespaced_pod(
            "default", watch=True, label_selector="app=vllm", _preload_content=False
        ) as sel,
        await core.list_namespaced_pod("default", watch=True, _preload_content=False) as every,
    ):
        assert (await read_event(sel))["type"] == "ADDED"
        assert (await read_event(every))["type"] == "ADDED"
        server.patch("v1", "Pod", "default", "p", {"metadata": {"labels": {"app": "other"}}})
        left = await read_event(sel)
        server.patch("v1", "Pod", "default", "p", {"metadata": {"labels": {"app": "vllm"}}})
        back = await read_event(sel)
        assert [(await read_event(every))["type"] for _ in range(2)] == ["MODIFIED", "MODIFIED"]
    assert left["type"] == "DELETED"
    assert left["object"]["metadata"]["labels"] == {"app": "vllm"}  # the previous state ...
    assert (
        int(left["object"]["metadata"]["resourceVersion"])
        == int(back["object"]["metadata"]["resourceVersion"]) - 1
    )
    assert back["type"] == "ADDED"


async def test_field_selector_watch_on_custom_objects(server: KubeApiServer, api: client.ApiClient) -> None:
    co = client.CustomObjectsApi(api)
    async with watch.Watch() as w:
        stream = w.stream(
            co.list_namespaced_custom_object,
            INF,
            "v1",
            "default",
            "inferencepools",
            field_selector="metadata.name=mine",
        )
        task = asyncio.create_task(anext(stream))
        await server.wait_for_watches(1)
        for name in ("theirs", "mine"):
            server.create(
                {"apiVersion": f"{INF}/v1", "kind": "InferencePool", "metadata": {"name": name}, "spec": {}}
            )
        event = await asyncio.wait_for(task, 5)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "mine")


async def test_timeout_seconds_ends_the_stream_cleanly(server: KubeApiServer, api: client.ApiClient) -> None:
    async with watch.Watch() as w:
        events = [
            e async for e in w.stream(client.CoreV1Api(api).list_namespaced_pod, "default", timeout_seconds=1)
        ]
    assert events == []
    await server.wait_for_watches(0)


async def test_a_client_that_goes_away_leaves_no_watch_behind(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    resp = await core.list_namespaced_pod("default", watch=True, _preload_content=False)
    await server.wait_for_watches(1)
    resp.close()
    await server.wait_for_watches(0)
    server.create(pod("after"))  # nothing is left to deliver it to
    assert server.store.subscriptions == 0


async def test_stopping_the_server_ends_open_watches(tmp_path: Path) -> None:
    srv = KubeApiServer()
    await srv.start()
    async with connect(srv, tmp_path) as api:
        resp = await client.CoreV1Api(api).list_namespaced_pod("default", watch=True, _preload_content=False)
        async with resp:
            await srv.wait_for_watches(1)
            await asyncio.wait_for(srv.stop(), 5)
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(resp.content.read(), 5)
    assert srv.open_watches == 0 and srv.store.subscriptions == 0


async def test_send_initial_events_ends_with_an_annotated_bookmark(
    server: KubeApiServer, api: client.ApiClient
) -> None:
    server.create(pod("a"))
    rv = str(server.resource_version)
    async with await client.CoreV1Api(api).list_namespaced_pod(
        "default",
        watch=True,
        send_initial_events=True,
        allow_watch_bookmarks=True,
        resource_version_match="NotOlderThan",
        _preload_content=False,
    ) as resp:
        added, mark = await read_event(resp), await read_event(resp)
    assert added["type"] == "ADDED"
    assert mark["type"] == "BOOKMARK" and mark["object"]["metadata"]["resourceVersion"] == rv
    assert mark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
