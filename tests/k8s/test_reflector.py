"""The reflector against an API server: list+watch, resume, 410 relist by diff, errors with backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from epp.k8s.client import Kube, ResourceWatch
from epp.k8s.reflector import Backoff, Reflector
from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer
from epp_kubeapi.objects import pod
from tests.k8s.conftest import Recorder


@contextlib.asynccontextmanager
async def running(kube: Kube, rec: Recorder, **kw: str) -> AsyncIterator[Reflector]:
    r = Reflector(
        "pods",
        ResourceWatch(kube, "", "v1", "pods", "default", **kw),
        rec,
        backoff=Backoff(initial=0.05, cap=0.2),
    )
    task = asyncio.create_task(r.run())
    try:
        await asyncio.wait_for(r.has_synced.wait(), 10)
        yield r
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_list_then_watch_delivers_every_change_once(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("a"))
    rec = Recorder()
    async with running(kube, rec) as r:
        assert rec.calls == [("upsert", "default/a"), ("synced", "")]
        api.create(pod("b"))
        api.patch("v1", "Pod", "default", "a", {"metadata": {"labels": {"x": "y"}}})
        api.delete("v1", "Pod", "default", "b")
        await rec.wait_for(lambda: ("delete", "default/b") in rec.calls)
        assert rec.calls[2:] == [("upsert", "default/b"), ("upsert", "default/a"), ("delete", "default/b")]
        assert set(r.store) == {"default/a"}
        assert r.lists == 1


async def test_bookmarks_advance_the_resource_version(api: KubeApiServer, kube: Kube) -> None:
    rec = Recorder()
    async with running(kube, rec) as r:
        before = r.resource_version
        api.create(pod("x", namespace="other"))  # another namespace: not ours, but moves the global RV
        await api.wait_for_watches(1)
        await until(lambda: r.resource_version != before, 5, what="a bookmark")
        assert int(r.resource_version) >= api.resource_version
        assert rec.calls == [("synced", "")]


async def test_dropped_watch_resumes_without_relist(api: KubeApiServer, kube: Kube) -> None:
    rec = Recorder()
    async with running(kube, rec) as r:
        await api.wait_for_watches(1)
        api.drop_watches()
        api.create(pod("a"))
        await rec.wait_for(lambda: ("upsert", "default/a") in rec.calls)
        assert r.lists == 1 and r.watches >= 2


async def test_410_relists_and_reports_only_real_changes(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("same"))
    api.create(pod("gone"))
    rec = Recorder()
    async with running(kube, rec) as r:
        api.down = True  # the watch drops; changes happen while we cannot see them
        api.delete("v1", "Pod", "default", "gone")
        api.create(pod("new"))
        api.compact()  # and the history we would resume from is gone
        start = len(rec.calls)
        api.down = False
        await rec.wait_for(lambda: rec.syncs == 2)
        assert sorted(rec.calls[start:-1]) == [("delete", "default/gone"), ("upsert", "default/new")]
        assert set(r.store) == {"default/same", "default/new"}
        assert r.lists == 2


async def test_watch_410_error_event_relists(api: KubeApiServer, kube: Kube) -> None:
    rec = Recorder()
    async with running(kube, rec) as r:
        await api.wait_for_watches(1)
        api.compact()  # open watches end with an ERROR 410 event
        await rec.wait_for(lambda: rec.syncs == 2)
        assert r.lists == 2 and r.errors == 0


async def test_server_errors_back_off_and_keep_the_store(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("a"))
    rec = Recorder()
    async with running(kube, rec) as r:
        api.fail_next(count=3, status=500, path_contains="watch=true")
        api.drop_watches()
        api.create(pod("b"))
        await rec.wait_for(lambda: ("upsert", "default/b") in rec.calls)
        assert r.errors == 3
        assert set(r.store) == {"default/a", "default/b"}
        assert ("delete", "default/a") not in rec.calls


async def test_initial_list_failure_retries(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("a"))
    api.fail_next(count=2, status=503, path_contains="/pods")
    rec = Recorder()
    async with running(kube, rec) as r:
        assert r.errors == 2 and rec.calls[0] == ("upsert", "default/a")


async def test_label_selector_narrows_server_side(api: KubeApiServer, kube: Kube) -> None:
    api.create(pod("a", labels={"app": "vllm"}))
    api.create(pod("b", labels={"app": "other"}))
    rec = Recorder()
    async with running(kube, rec, label_selector="app=vllm") as r:
        assert set(r.store) == {"default/a"}
        api.patch("v1", "Pod", "default", "a", {"metadata": {"labels": {"app": "other"}}})
        await rec.wait_for(lambda: ("delete", "default/a") in rec.calls)


def test_backoff_grows_with_jitter_and_caps() -> None:
    import random

    b = Backoff(initial=0.5, cap=4.0, rng=random.Random(1))
    delays = [b.next() for _ in range(8)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert delays[0] <= 0.5 and max(delays[-3:]) > 2.0
    b.reset()
    assert b.next() <= 0.5


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_retried_not_fatal(api: KubeApiServer, kube: Kube, status: int) -> None:
    rec = Recorder()
    api.fail_next(count=1, status=status, path_contains="/pods")
    async with running(kube, rec) as r:
        assert r.errors == 1 and str(status) in r.last_error
