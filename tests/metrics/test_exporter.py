"""The metrics port: /debug/plugins/state serves the state callback as JSON, behind the same auth."""

from __future__ import annotations

from typing import Any

import aiohttp

from epp.metrics.exporter import MetricsServer


async def test_debug_state_is_json_and_guarded() -> None:
    calls: list[int] = []

    def state() -> dict[str, Any]:
        calls.append(1)
        return {"endpoints": [{"name": "a", "metricsAgeSeconds": 0.1}], "plugins": {}}

    async def authorize(header: str, path: str) -> tuple[int, str]:
        return (200, "") if header == "Bearer ok" else (401, "missing bearer token")

    async with (
        MetricsServer("127.0.0.1", 0, enable_pprof=False, authorize=authorize, debug_state=state) as srv,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://127.0.0.1:{srv.port}/debug/plugins/state"
        async with http.get(url) as r:
            assert r.status == 401
        assert calls == []  # nothing computed for an unauthorised caller
        async with http.get(url, headers={"Authorization": "Bearer ok"}) as r:
            assert r.status == 200 and r.content_type == "application/json"
            assert await r.json() == state()


async def test_no_debug_route_without_a_state_callback() -> None:
    async with MetricsServer("127.0.0.1", 0, enable_pprof=False) as srv, aiohttp.ClientSession() as http:
        r = await http.get(f"http://127.0.0.1:{srv.port}/debug/plugins/state")
        assert r.status == 404
        r.release()


async def test_debug_decisions_by_id_and_limit_behind_the_same_auth() -> None:
    from epp.explain.record import Decision, DecisionRing

    ring = DecisionRing(4)
    for i in range(6):
        ring.add(Decision(f"r{i}", 0.0, outcome="routed"))

    async def authorize(header: str, path: str) -> tuple[int, str]:
        return (200, "") if header == "Bearer ok" else (401, "missing bearer token")

    ok = {"Authorization": "Bearer ok"}
    async with (
        MetricsServer("127.0.0.1", 0, enable_pprof=False, authorize=authorize, decisions=ring) as srv,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://127.0.0.1:{srv.port}/debug/decisions"
        async with http.get(url) as r:
            assert r.status == 401
        async with http.get(url, params={"request_id": "r3"}, headers=ok) as r:
            assert r.status == 200
            assert [d["requestId"] for d in (await r.json())["decisions"]] == ["r3"]
        async with http.get(url, params={"request_id": "r0"}, headers=ok) as r:  # evicted
            assert (await r.json())["decisions"] == []
        async with http.get(url, params={"limit": "2"}, headers=ok) as r:
            assert [d["requestId"] for d in (await r.json())["decisions"]] == ["r5", "r4"]
        async with http.get(url, params={"limit": "-1"}, headers=ok) as r:
            assert r.status == 400


async def test_no_decisions_route_when_the_buffer_is_off() -> None:
    async with MetricsServer("127.0.0.1", 0, enable_pprof=False) as srv, aiohttp.ClientSession() as http:
        r = await http.get(f"http://127.0.0.1:{srv.port}/debug/decisions")
        assert r.status == 404
        r.release()
