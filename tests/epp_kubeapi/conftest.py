"""A started fake apiserver and a ``kubernetes_asyncio`` client loaded from its kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from kubernetes_asyncio import client, config

from epp_kubeapi import KubeApiServer


@pytest.fixture
async def server() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(bookmark_interval=0.2) as srv:
        srv.register_inference_crds()
        yield srv


@pytest.fixture
async def api(server: KubeApiServer, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    async with connect(server, tmp_path) as api_client:
        yield api_client


@contextlib.asynccontextmanager
async def connect(
    server: KubeApiServer, tmp_path: Path, token: str = "admin"
) -> AsyncIterator[client.ApiClient]:
    """A client configured the way the EPP configures one: from a kubeconfig file."""
    path = server.write_kubeconfig(
        tmp_path / f"kubeconfig-{server.url.rsplit(':', 1)[1]}-{token}", token=token
    )
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


def pod(
    name: str, namespace: str = "default", labels: dict[str, str] | None = None, ip: str = ""
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "model", "image": "vllm"}]},
    }
    if ip:
        body["status"] = {"podIP": ip, "phase": "Running"}
    return body


def pool(name: str, namespace: str = "default", selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": selector or {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


async def read_event(resp: ClientResponse) -> dict[str, Any]:
    """The next event of a raw (``_preload_content=False``) watch stream."""
    line = await asyncio.wait_for(resp.content.readline(), 5)
    assert line, "the watch stream ended"
    event: dict[str, Any] = json.loads(line)
    return event


async def read_until_end(resp: ClientResponse) -> list[dict[str, Any]]:
    """Every remaining event until the server ends the stream cleanly."""
    events = []
    while line := await asyncio.wait_for(resp.content.readline(), 5):
        events.append(json.loads(line))
    return events
