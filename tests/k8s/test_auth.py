"""/metrics behind TokenReview + SubjectAccessReview, as controller-runtime's filter does it."""

from __future__ import annotations

import aiohttp

from epp.k8s.auth import MetricsAuthorizer
from epp.k8s.client import Kube
from epp.metrics.exporter import MetricsServer
from epp_kubeapi import KubeApiServer, UserInfo


def users(api: KubeApiServer) -> None:
    api.add_token(
        "prom-token",
        UserInfo(
            username="system:serviceaccount:monitoring:prometheus", groups=("system:authenticated",), uid="1"
        ),
    )
    api.add_token(
        "nobody-token",
        UserInfo(username="system:serviceaccount:default:nobody", groups=("system:authenticated",), uid="2"),
    )
    api.allow("system:serviceaccount:monitoring:prometheus", verb="get", path="/metrics")


async def test_decisions(api: KubeApiServer, kube: Kube) -> None:
    users(api)
    auth = MetricsAuthorizer(kube)
    assert (await auth.check("Bearer prom-token", "/metrics")).status == 200
    assert (await auth.check("Bearer nobody-token", "/metrics")).status == 403
    assert (await auth.check("Bearer forged", "/metrics")).status == 401
    assert (await auth.check("", "/metrics")).status == 401
    assert (await auth.check("Basic abc", "/metrics")).status == 401
    assert (await auth.check("Bearer prom-token", "/debug/pprof/heap")).status == 403


async def test_decisions_are_cached_briefly(api: KubeApiServer, kube: Kube) -> None:
    users(api)
    now = [0.0]
    auth = MetricsAuthorizer(kube, ttl=10.0, clock=lambda: now[0])
    for _ in range(5):
        assert (await auth.check("Bearer prom-token", "/metrics")).status == 200
    assert auth.reviews == 1
    now[0] = 11.0
    await auth.check("Bearer prom-token", "/metrics")
    assert auth.reviews == 2


async def test_api_server_errors_are_500_and_not_cached(api: KubeApiServer, kube: Kube) -> None:
    users(api)
    auth = MetricsAuthorizer(kube)
    api.fail_next(count=1, status=503, path_contains="tokenreviews")
    assert (await auth.check("Bearer prom-token", "/metrics")).status == 500
    assert (await auth.check("Bearer prom-token", "/metrics")).status == 200


async def test_metrics_server_enforces_it(api: KubeApiServer, kube: Kube) -> None:
    users(api)
    auth = MetricsAuthorizer(kube)

    async def authorize(header: str, path: str) -> tuple[int, str]:
        d = await auth.check(header, path)
        return d.status, d.reason

    async with MetricsServer("127.0.0.1", 0, authorize=authorize) as srv, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        async with http.get(url) as r:
            assert r.status == 401
        async with http.get(url, headers={"Authorization": "Bearer nobody-token"}) as r:
            assert r.status == 403
            assert "may not get /metrics" in await r.text()
        async with http.get(url, headers={"Authorization": "Bearer prom-token"}) as r:
            assert r.status == 200
            assert "inference_" in await r.text() or r.headers["Content-Type"].startswith("text/plain")
