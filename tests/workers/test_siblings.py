"""Worker 0's view of its siblings (epp.workers.siblings) over real Unix sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from epp.testing.waiting import until
from epp.workers.role import WorkerRole
from epp.workers.siblings import Siblings, quorum


def test_the_pod_is_ready_with_at_least_half_of_its_workers() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 8)] == [1, 1, 2, 2, 4]


class FakeWorker:
    """A sibling's socket: /ready, /metrics and /debug/decisions as a worker serves them."""

    def __init__(
        self, ready: bool, requests: float, decisions: list[dict[str, Any]], extra: str = ""
    ) -> None:
        self.ready = ready
        self.requests = requests
        self.decisions = decisions
        self.extra = extra  # more exposition lines

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/debug/decisions", self._decisions)
        return app

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=f"# TYPE requests_total counter\nrequests_total {self.requests}\n{self.extra}"
        )

    async def _decisions(self, request: web.Request) -> web.Response:
        wanted = request.query.get("request_id", "")
        found = [d for d in self.decisions if not wanted or d["requestId"] == wanted]
        return web.Response(
            body=orjson.dumps({"size": 8, "decisions": found}), content_type="application/json"
        )


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start(*workers: FakeWorker) -> WorkerRole:
        role = WorkerRole(0, len(workers) + 1, tmp_path, "pod")
        for i, w in enumerate(workers, 1):
            runner = web.AppRunner(w.app())
            await runner.setup()
            await web.UnixSite(runner, str(role.metrics_socket(i))).start()
            runners.append(runner)
        return role

    yield start
    for r in runners:
        await r.cleanup()


async def test_quorum_follows_the_siblings_readiness(pod: Callable[..., Any]) -> None:
    w1, w2, w3 = FakeWorker(True, 0, []), FakeWorker(False, 0, []), FakeWorker(False, 0, [])
    role = await pod(w1, w2, w3)  # 4 workers: 2 must be ready
    async with Siblings(role, interval=0.01) as sib:
        await until(lambda: sib.ready == 1, what="w1 seen ready")
        assert sib.quorate(True) and not sib.quorate(False)
        w1.ready = False
        await until(lambda: sib.ready == 0, what="w1 seen not ready")
        assert not sib.quorate(True)
        w2.ready = w3.ready = True
        await until(lambda: sib.ready == 2, what="w2 and w3 ready")
        assert sib.quorate(False)


async def test_a_sibling_that_is_down_is_neither_ready_nor_counted(pod: Callable[..., Any]) -> None:
    role = await pod(FakeWorker(True, 5, []))
    role = WorkerRole(0, 3, role.run_dir, "pod")  # worker 2 never started: no socket
    async with Siblings(role, interval=0.01) as sib:
        await until(lambda: sib.ready == 1, what="w1 seen ready")  # one round polls both siblings
        body = await sib.metrics(b"# TYPE requests_total counter\nrequests_total 2.0\n")
    values = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert values["requests_total"] == 7  # worker 0's 2 and worker 1's 5
    assert values["epp_workers"] == 3 and values["epp_workers_reporting"] == 2
    assert values["epp_workers_ready"] == 2  # worker 0 and worker 1; worker 2 is down


async def test_workers_ready_counts_worker_0_only_when_it_is_ready(pod: Callable[..., Any]) -> None:
    role = await pod(FakeWorker(True, 0, []), FakeWorker(False, 0, []))
    own = [False]
    async with Siblings(role, interval=0.01, own_ready=lambda: own[0]) as sib:
        await until(lambda: sib.ready == 1, what="w1 seen ready")
        for expected in (1, 2):
            body = await sib.metrics(b"")
            values = {
                s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
            }
            assert values["epp_workers_ready"] == expected
            own[0] = True


async def test_decisions_are_merged_newest_first(pod: Callable[..., Any]) -> None:
    role = await pod(FakeWorker(True, 0, [{"requestId": "b", "time": 2.0}, {"requestId": "d", "time": 4.0}]))
    own = {"size": 8, "decisions": [{"requestId": "c", "time": 3.0}, {"requestId": "a", "time": 1.0}]}
    async with Siblings(role) as sib:
        latest = await sib.decisions(own, "", 3)
        assert [d["requestId"] for d in latest["decisions"]] == ["d", "c", "b"]
        one = await sib.decisions({"size": 8, "decisions": []}, "b", 20)
        assert [d["requestId"] for d in one["decisions"]] == ["b"]


INDEX = "# TYPE inference_extension_prefix_indexer_size gauge\ninference_extension_prefix_indexer_size {}\n"


@pytest.mark.parametrize(("synced", "expected"), [(False, 2100.0), (True, 1100.0)])
async def test_the_pods_prefix_index_size_counts_synced_copies_once(
    pod: Callable[..., Any], synced: bool, expected: float
) -> None:
    role = await pod(FakeWorker(True, 0, [], extra=INDEX.format(1000)))
    own = INDEX.format(1100).encode()
    async with Siblings(role, synced=synced) as sib:
        body = (await sib.metrics(own)).decode()
    sizes = [
        s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
        if s.name == "inference_extension_prefix_indexer_size"
    ]
    assert sizes == [expected]
