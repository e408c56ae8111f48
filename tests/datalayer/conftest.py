"""Fixtures for the data layer: model-server stand-ins on 127.0.0.1:0 and plugin builders."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datalayer.extractors.core_metrics import CoreMetricsExtractor, CoreMetricsExtractorParams
from epp.datalayer.sources.metrics_http import MetricsDataSource, MetricsDataSourceParams
from epp.testing.plugins import FakeHandle

DATA = Path(__file__).parent / "data"
VLLM_SMALL = (DATA / "vllm_small.txt").read_bytes()
VLLM_FULL = (DATA / "vllm_full.txt").read_bytes()


HANDLE = FakeHandle()  # plugins built alone: no other plugin to look up


def make_endpoint(name: str = "default/pod-rank-0", port: int = 8000, **kw: Any) -> Endpoint:
    return Endpoint(EndpointMetadata(name=name, address=kw.pop("address", "127.0.0.1"), port=port, **kw))


def make_source(**params: Any) -> MetricsDataSource:
    return MetricsDataSource("metrics-data-source", MetricsDataSourceParams(**params), HANDLE)


def make_extractor(**params: Any) -> CoreMetricsExtractor:
    return CoreMetricsExtractor(
        "core-metrics-extractor", CoreMetricsExtractorParams.model_validate(params), HANDLE
    )


def vllm_page(waiting: int = 3, running: int = 7, kv: float = 0.4217) -> bytes:
    """The realistic small vLLM page with chosen queue, running and KV values."""
    page = VLLM_SMALL
    for name, value in (
        (b"vllm:num_requests_waiting", waiting),
        (b"vllm:num_requests_running", running),
        (b"vllm:kv_cache_usage_perc", kv),
    ):
        page = re.sub(rb"(?m)^(" + re.escape(name) + rb"\{[^}]*\}) \S+$", rb"\1 " + str(value).encode(), page)
    return page


@dataclass
class Behaviour:
    """What one fake model server does on GET /metrics; tests flip it while it runs."""

    body: bytes = field(default_factory=vllm_page)
    status: int = 200
    hang: bool = False  # never answer
    chunked: bool = False
    requests: int = 0
    connections: set[int] = field(default_factory=set)
    served: asyncio.Event = field(default_factory=asyncio.Event)


class FakeModelServer:
    """An aiohttp server on 127.0.0.1:0 serving /metrics per its ``Behaviour``."""

    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        b.requests += 1
        transport = request.transport
        if transport is not None:
            b.connections.add(id(transport))
        if b.hang:
            await self._release.wait()
        b.served.set()
        if b.chunked:
            resp = web.StreamResponse(status=b.status)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            half = len(b.body) // 2
            await resp.write(b.body[:half])
            await resp.write(b.body[half:])
            await resp.write_eof()
            return resp
        return web.Response(status=b.status, body=b.body, content_type="text/plain")

    async def start(self) -> FakeModelServer:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._bound_port(self._runner)
        return self

    @staticmethod
    def _bound_port(runner: web.AppRunner) -> int:
        port: int = runner.addresses[0][1]
        return port

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def endpoint(self, name: str | None = None, **kw: Any) -> Endpoint:
        return make_endpoint(name or f"default/pod-{self.port}-rank-0", self.port, **kw)


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[int], Any]]:
    """``await servers(n)`` starts n fake model servers; all are stopped after the test."""
    started: list[FakeModelServer] = []

    async def start(n: int) -> list[FakeModelServer]:
        new = [await FakeModelServer().start() for _ in range(n)]
        started.extend(new)
        return new

    yield start
    for s in started:
        await s.stop()
