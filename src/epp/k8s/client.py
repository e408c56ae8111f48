"""The API-server connection: configuration as controller-runtime finds it, and raw JSON requests.

Configuration order (controller-runtime's ``GetConfig``): ``--kubeconfig``, then ``$KUBECONFIG``,
then the in-cluster service account, then ``~/.kube/config``.  Requests go through
kubernetes-asyncio's ``ApiClient`` (auth, TLS, token refresh, connection pool) with
``_preload_content=False``: the EPP reads a few fields of each object, so it decodes JSON with
orjson itself instead of building model classes.  Non-watch requests share a token bucket
(controller-runtime's defaults: 20 QPS, burst 30) so a retry storm cannot flood the server.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson
import structlog

from epp.errors import ConfigError
from epp.k8s.errors import raise_for_status

log = structlog.get_logger(__name__)

QPS: Final = 20.0
BURST: Final = 30
REQUEST_TIMEOUT: Final = 30.0
SA_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass(slots=True)
class TokenBucket:
    """``QPS`` requests per second on average, ``BURST`` at once; ``acquire`` waits its turn."""

    rate: float = QPS
    burst: int = BURST
    _tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)
        self._last = time.monotonic()

    async def acquire(self) -> None:
        while True:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self._tokens) / self.rate)


def _in_cluster(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SA_TOKEN)


async def load_configuration(kubeconfig: str, env: Mapping[str, str]) -> tuple[Any, str]:
    """A kubernetes-asyncio ``Configuration`` and where it came from; ConfigError if none."""
    # kubernetes-asyncio is imported where a client is made, not with this module: importing it
    # costs ~0.4 s, and every EPP loads this module (its plugins register at start) whether or
    # not it talks to an API server.
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    cfg = k8s_client.Configuration()
    path = kubeconfig or env.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        if path:
            await k8s_config.load_kube_config(config_file=path, client_configuration=cfg)
            return cfg, f"kubeconfig {path}"
        if _in_cluster(env):
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg, "in-cluster service account"
        home = Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"
        if home.exists():
            await k8s_config.load_kube_config(config_file=str(home), client_configuration=cfg)
            return cfg, f"kubeconfig {home}"
    except (k8s_config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(f"Kubernetes client configuration from {path or 'the cluster'}: {e}") from None
    raise ConfigError(
        "no Kubernetes client configuration: not running in a cluster (KUBERNETES_SERVICE_HOST unset "
        "or no service-account token), and no --kubeconfig, $KUBECONFIG or ~/.kube/config"
    )


class Kube:
    """Raw JSON access to the API server; one per process, closed at shutdown."""

    def __init__(self, configuration: Any, *, limiter: TokenBucket | None = None) -> None:
        from kubernetes_asyncio import client as k8s_client  # lazily: see load_configuration

        configuration.connection_pool_maxsize = 32  # every watch holds a connection
        self._api = k8s_client.ApiClient(configuration=configuration)
        self._limiter = limiter or TokenBucket()

    @classmethod
    async def connect(cls, kubeconfig: str, env: Mapping[str, str]) -> Kube:
        cfg, origin = await load_configuration(kubeconfig, env)
        log.info("k8s_client_configured", source=origin, host=cfg.host)
        return cls(cfg)

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout | float = REQUEST_TIMEOUT,
        limited: bool = True,
    ) -> aiohttp.ClientResponse:
        """Send one request; the caller reads (and closes) the response."""
        if limited:
            await self._limiter.acquire()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        resp: aiohttp.ClientResponse = await self._api.call_api(
            path,
            method,
            query_params=list(query),
            header_params=headers,
            body=orjson.loads(orjson.dumps(body)) if body is not None else None,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        return resp

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        """Request and decode; raises ``ApiError`` on a non-2xx answer."""
        resp = await self.request(method, path, **kw)
        async with resp:
            await raise_for_status(resp)
            return orjson.loads(await resp.read())


def resource_path(group: str, version: str, plural: str, namespace: str = "", name: str = "") -> str:
    """``/api/v1/...`` for the core group, ``/apis/<group>/<version>/...`` otherwise."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    return f"{base}/{name}" if name else base


@dataclass(frozen=True, slots=True)
class ResourceWatch:
    """List/watch of one resource in one namespace, optionally narrowed by selectors."""

    kube: Kube
    group: str
    version: str
    plural: str
    namespace: str
    label_selector: str = ""
    field_selector: str = ""

    def _query(self) -> list[tuple[str, str]]:
        q: list[tuple[str, str]] = []
        if self.label_selector:
            q.append(("labelSelector", self.label_selector))
        if self.field_selector:
            q.append(("fieldSelector", self.field_selector))
        return q

    @property
    def path(self) -> str:
        return resource_path(self.group, self.version, self.plural, self.namespace)

    async def list(self) -> aiohttp.ClientResponse:
        return await self.kube.request("GET", self.path, query=self._query())

    async def watch(self, resource_version: str, timeout_seconds: int) -> aiohttp.ClientResponse:
        query = [
            *self._query(),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # no total deadline; a connection silent for longer than the server's own timeout is dead
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30)
        return await self.kube.request("GET", self.path, query=query, timeout=timeout)
