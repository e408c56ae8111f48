"""A test API server (real REST + watch protocol) and the EPP's client connected to it by kubeconfig."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable

import pytest

from epp.k8s.client import Kube
from epp.k8s.reflector import Obj, object_key
from epp_kubeapi import KubeApiServer


@pytest.fixture
async def api() -> AsyncIterator[KubeApiServer]:
    server = KubeApiServer(bookmark_interval=0.2)
    server.register_inference_crds()
    async with server:
        yield server


@pytest.fixture
async def kube(api: KubeApiServer, tmp_path: pathlib.Path) -> AsyncIterator[Kube]:
    path = api.write_kubeconfig(tmp_path / "kubeconfig")
    k = await Kube.connect(str(path), {})
    yield k
    await k.close()


class Recorder:
    """A reflector handler that remembers every call and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.syncs = 0
        self._changed = asyncio.Condition()

    def _note(self, entry: tuple[str, str]) -> None:
        self.calls.append(entry)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def upsert(self, obj: Obj) -> None:
        self._note(("upsert", object_key(obj)))

    def delete(self, obj: Obj) -> None:
        self._note(("delete", object_key(obj)))

    def synced(self) -> None:
        self.syncs += 1
        self._note(("synced", ""))

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)
