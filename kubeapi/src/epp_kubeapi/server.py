"""``KubeApiServer``: the in-process fake apiserver, its Python API and its fault switches.

Tests seed and mutate objects through the Python API (as a controller or kubelet
would, with no status-subresource or namespace rules) and point the EPP, or the
``kubernetes_asyncio`` client, at ``url`` through ``write_kubeconfig``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml
from aiohttp import web

from . import patch as patching
from .auth import MASTERS, Auth, Rule, UserInfo
from .handlers import RestApi, json_response
from .resources import Registry, Resource, inference_crds
from .status import ApiError, NotFound, failure
from .store import Obj, ObjectStore
from .watch import WatchStream

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server saw it (``username`` is None when authentication failed)."""

    method: str
    path: str
    query: dict[str, str]
    username: str | None


@dataclass(slots=True)
class _Fault:
    remaining: int
    status: int
    path_contains: str


@dataclass(slots=True)
class _Watches:
    """Open watch streams, and waiters for their count to reach a value."""

    streams: set[WatchStream] = field(default_factory=set)
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    def changed(self) -> None:
        for count, fut in self.waiters:
            if count == len(self.streams) and not fut.done():
                fut.set_result(None)
        self.waiters = [(c, f) for c, f in self.waiters if not f.done()]


class KubeApiServer:
    """A Kubernetes apiserver speaking the real REST and watch protocol on 127.0.0.1."""

    def __init__(self, *, bookmark_interval: float = 1.0, history: int = 10_000) -> None:
        self.registry = Registry()
        self.store = ObjectStore(history)
        self.auth = Auth()
        self.requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        self._down = False
        self._watches = _Watches()
        self._api = RestApi(self.store, self.registry, self.auth, bookmark_interval, self._serve_watch)
        self._runner: web.AppRunner | None = None
        self._url = ""
        namespaces = self.registry.by_kind("v1", "Namespace")
        for name in DEFAULT_NAMESPACES:
            self.store.create(namespaces, {"metadata": {"name": name}, "status": {"phase": "Active"}})

    # lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self._api.handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        bound = server.sockets[0].getsockname()
        self._url = f"http://{host}:{bound[1]}"

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeApiServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if not self._url:
            raise RuntimeError("KubeApiServer is not started")
        return self._url

    def write_kubeconfig(self, path: str | Path, token: str = "admin", namespace: str = "default") -> Path:
        """Write a kubeconfig for ``url``; ``token`` becomes a ``system:masters`` user named after it."""
        self.auth.tokens.setdefault(token, UserInfo(username=token, groups=(MASTERS, "system:authenticated")))
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "kubeapi", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "kubeapi",
                    "context": {"cluster": "kubeapi", "user": "kubeapi", "namespace": namespace},
                }
            ],
            "current-context": "kubeapi",
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config))
        return target

    # resources

    def register(self, resource: Resource) -> None:
        """Serve ``resource`` (like installing its CRD)."""
        self.registry.add(resource)

    def register_inference_crds(self, *, objectives: bool = True) -> None:
        """GIE's CRDs; ``objectives=False`` simulates a cluster without InferenceObjective/ModelRewrite."""
        for resource in inference_crds(objectives=objectives):
            self.register(resource)

    # objects (full access: status and namespaces are not policed here)

    def create(self, obj: Obj) -> Obj:
        """Create ``obj`` by apiVersion/kind; its namespace defaults to ``default``, created if missing."""
        resource = self.registry.by_kind(obj["apiVersion"], obj["kind"])
        if resource.virtual:
            raise ValueError(f"{resource.kind} is a review API; it stores no objects")
        obj = copy.deepcopy(obj)
        if resource.namespaced:
            namespace = obj.setdefault("metadata", {}).setdefault("namespace", "default")
            namespaces = self.registry.by_kind("v1", "Namespace")
            if self.store.get(namespaces, "", namespace) is None:
                self.store.create(
                    namespaces, {"metadata": {"name": namespace}, "status": {"phase": "Active"}}
                )
        return copy.deepcopy(self.store.create(resource, obj))

    def update(self, obj: Obj) -> Obj:
        """Replace the whole object (status included); a carried resourceVersion must match (Conflict)."""
        resource = self.registry.by_kind(obj["apiVersion"], obj["kind"])
        obj = copy.deepcopy(obj)
        if resource.namespaced:
            obj.setdefault("metadata", {}).setdefault("namespace", "default")
        return copy.deepcopy(self.store.replace(resource, obj))

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, merge_patch: Obj) -> Obj:
        """Apply a JSON merge patch (RFC 7386) to the whole object."""
        resource = self.registry.by_kind(api_version, kind)
        current = self.store.get(resource, _ns(resource, namespace), name)
        if current is None:
            raise NotFound(resource, name)
        patched = patching.merge_patch(current, merge_patch)
        patched.setdefault("metadata", {}).update(name=name, namespace=_ns(resource, namespace))
        return copy.deepcopy(self.store.replace(resource, patched))

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        resource = self.registry.by_kind(api_version, kind)
        return copy.deepcopy(self.store.delete(resource, _ns(resource, namespace), name))

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        resource = self.registry.by_kind(api_version, kind)
        obj = self.store.get(resource, _ns(resource, namespace), name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        resource = self.registry.by_kind(api_version, kind)
        return copy.deepcopy(self.store.objects(resource, namespace if resource.namespaced else None))

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self.store.rv

    # faults

    def compact(self) -> None:
        """Drop all history: resuming from an older RV is a 410, open watches end with an ERROR 410."""
        self.store.compact()

    def drop_watches(self) -> None:
        """Abort every open watch connection without a final event."""
        for stream in list(self._watches.streams):
            stream.drop()

    def fail_next(self, count: int = 1, status: int = 500, path_contains: str = "") -> None:
        """The next ``count`` requests whose path+query contain ``path_contains`` get a Status ``status``."""
        self._faults.append(_Fault(count, status, path_contains))

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        """While down every request is a 503 and open watches are dropped."""
        self._down = value
        if value:
            self.drop_watches()

    # auth

    def add_token(self, token: str, user: UserInfo) -> None:
        self.auth.tokens[token] = user

    def allow(self, subject: str, verb: str = "*", path: str | None = None, **resource_attrs: str) -> None:
        """Let ``subject`` (a user or group) pass SubjectAccessReviews for ``verb`` on ``path``.

        Without ``path``, the rule is about resources: keyword filters ``group``, ``resource``,
        ``namespace`` and ``name`` (default ``*``).
        """
        self.auth.rules.append(Rule(subject, verb, path, **resource_attrs))

    # watches

    @property
    def open_watches(self) -> int:
        return len(self._watches.streams)

    async def wait_for_watches(self, count: int, timeout: float = 5.0) -> None:
        """Wait until exactly ``count`` watches are open (a way to synchronise without sleeping)."""
        if self.open_watches == count:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watches.waiters.append((count, fut))
        async with asyncio.timeout(timeout):
            await fut

    async def _serve_watch(self, stream: WatchStream, request: web.Request) -> web.StreamResponse:
        self._watches.streams.add(stream)
        self._watches.changed()
        try:
            return await stream.serve(request)
        finally:
            self._watches.streams.discard(stream)
            self._watches.changed()

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        user = self.auth.user(request.headers.get("Authorization"))
        query = {k: request.query[k] for k in request.query}
        self.requests.append(
            RecordedRequest(request.method, request.path, query, user.username if user else None)
        )
        try:
            self._gate(request.path_qs, user)
            return await handler(request)
        except ApiError as exc:
            return json_response(exc.status(), exc.code)
        except Exception as exc:  # a bug in the fake still answers with a Status the client can parse
            return json_response(failure(500, f"fake apiserver error: {exc!r}"), 500)

    def _gate(self, path_qs: str, user: UserInfo | None) -> None:
        """Outage first, then injected faults, then authentication: the order a test expects to observe."""
        if self._down:
            raise ApiError(503, "the fake apiserver is down")
        self._take_fault(path_qs)
        if user is None:
            raise ApiError(401, "Unauthorized")

    def _take_fault(self, path_qs: str) -> None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.path_contains in path_qs:
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
                raise ApiError(fault.status, f"injected failure ({fault.status})")


def _ns(resource: Resource, namespace: str | None) -> str:
    return (namespace or "default") if resource.namespaced else ""
