"""The REST surface: URL → resource, verbs → store operations, results → JSON or Status.

Everything HTTP-specific lives here (path grammar, status-subresource rules for client
writes, namespace existence, pagination); the store knows nothing of HTTP, and the
Python API in ``server.py`` bypasses these rules the way a controller with full
access would.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from . import discovery, patch
from .auth import Auth
from .resources import Registry, Resource
from .selectors import object_fields, parse_fields, parse_labels
from .status import ApiError, NotFound, success
from .store import Obj, ObjectStore, StatusMode
from .watch import WatchParams, WatchStream

NAMESPACES = ("", "v1", "namespaces")
PODS = ("", "v1", "pods")
COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
StreamHook = Callable[[WatchStream, web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Target:
    """What a resource URL names."""

    resource: Resource
    namespace: str | None  # None: cluster-scoped, or all namespaces
    name: str | None
    subresource: str
    watch: bool


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class RestApi:
    """Serves discovery and resource requests against one store."""

    def __init__(
        self, store: ObjectStore, registry: Registry, auth: Auth, bookmark_every: float, stream: StreamHook
    ) -> None:
        self.store, self.registry, self.auth = store, registry, auth
        self.bookmark_every = bookmark_every
        self.stream = stream  # runs a WatchStream (the server tracks open watches through it)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = path.strip("/").split("/")
        if path == "/version":
            return json_response(discovery.VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/api":
            return json_response(discovery.core_versions(request.host))
        if path == "/apis":
            return json_response(discovery.group_list(self.registry))
        if parts[0] == "api" and len(parts) == 2:
            return json_response(discovery.resource_list(self.registry, "", parts[1]))
        if parts[0] == "apis" and len(parts) == 2:
            return json_response(discovery.group(self.registry, parts[1]))
        if parts[0] == "apis" and len(parts) == 3:
            return json_response(discovery.resource_list(self.registry, parts[1], parts[2]))
        target = self.target(parts)
        if target.name is None:
            return await self._collection(request, target)
        return await self._item(request, target)

    def target(self, parts: list[str]) -> Target:
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        watch = rest[0] == "watch" and len(rest) > 1
        rest = rest[1:] if watch else rest
        namespace = None
        namespace_sub = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
        if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_sub:
            namespace, rest = rest[1], rest[2:]
        resource = self.registry.resolve(group, version, rest[0])
        if resource is None or len(rest) > 3 or (namespace is not None and not resource.namespaced):
            raise ApiError(404, "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if (sub and (sub != "status" or not resource.status_subresource)) or (
            name is not None and resource.namespaced and namespace is None
        ):
            raise ApiError(404, "the server could not find the requested resource")
        return Target(resource, namespace, name, sub, watch)

    async def _collection(self, request: web.Request, t: Target) -> web.StreamResponse:
        watching = request.method == "GET" and (t.watch or _flag(request.query.get("watch")))
        _permit(t.resource, COLLECTION_VERBS.get(request.method, ""), watching)
        if request.method == "GET" and watching:
            return await self._watch(request, t)
        if request.method == "GET":
            return json_response(self._list(request, t))
        if request.method == "POST" and (t.namespace is not None or not t.resource.namespaced):
            return await self._create(request, t)
        if request.method == "DELETE":
            items = [self.store.delete(t.resource, *_key(o), None) for o in self._select(request, t)]
            return json_response(self._list_body(t.resource, items, self.store.rv))
        raise ApiError(
            405, f"the server does not allow this method on the requested resource ({request.method})"
        )

    async def _item(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        namespace = t.namespace or ""
        watching = request.method == "GET" and t.watch
        _permit(t.resource, ITEM_VERBS.get(request.method, ""), watching)
        if watching:
            return await self._watch(request, t)
        if request.method == "GET":
            obj = self.store.get(t.resource, namespace, t.name)
            if obj is None:
                raise NotFound(t.resource, t.name)
            return json_response(obj)
        mode: StatusMode = (
            "all" if not t.resource.status_subresource else ("status" if t.subresource else "spec")
        )
        if request.method == "PUT":
            body = await _body(request, dict)
            md = body.setdefault("metadata", {})
            if md.get("name", t.name) != t.name:
                raise ApiError(
                    400,
                    f"the name of the object ({md['name']}) does not match the name on the URL ({t.name})",
                )
            md["name"], md["namespace"] = t.name, namespace
            return json_response(self.store.replace(t.resource, body, mode))
        if request.method == "PATCH":
            current = self.store.get(t.resource, namespace, t.name)
            if current is None:
                raise NotFound(t.resource, t.name)
            custom = not self.registry.is_builtin(t.resource)
            patched = patch.apply(request.content_type, current, await _body(request, object), custom=custom)
            patched.setdefault("metadata", {}).update(name=t.name, namespace=namespace)
            return json_response(self.store.replace(t.resource, patched, mode))
        if request.method == "DELETE" and not t.subresource:
            options = await _body(request, dict) if await request.read() else {}
            deleted = self.store.delete(t.resource, namespace, t.name, options.get("preconditions"))
            body = deleted if t.resource.delete_returns_object else success(t.resource, deleted)
            return json_response(body)
        raise ApiError(
            405, f"the server does not allow this method on the requested resource ({request.method})"
        )

    async def _create(self, request: web.Request, t: Target) -> web.Response:
        body = await _body(request, dict)
        if t.resource.virtual:
            review = (
                self.auth.token_review
                if t.resource.kind == "TokenReview"
                else self.auth.subject_access_review
            )
            return json_response(review(body), 201)
        if body.get("apiVersion", t.resource.api_version) != t.resource.api_version:
            raise ApiError(
                400,
                f"the API version in the data ({body['apiVersion']}) does not match the expected "
                f"API version ({t.resource.api_version})",
            )
        md = body.setdefault("metadata", {})
        if t.namespace is not None:
            if md.get("namespace", t.namespace) != t.namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            namespaces = self.registry.resolve(*NAMESPACES)
            if namespaces is not None and self.store.get(namespaces, "", t.namespace) is None:
                raise NotFound(namespaces, t.namespace)
            md["namespace"] = t.namespace
        if t.resource.status_subresource:  # a client's create cannot set status, as on a real cluster
            body.pop("status", None)
            if t.resource.key == PODS:
                body["status"] = {"phase": "Pending"}
        return json_response(self.store.create(t.resource, body), 201)

    def _select(self, request: web.Request, t: Target) -> list[Obj]:
        passes = self._filter(request, t)
        return [o for o in self.store.objects(t.resource, t.namespace) if passes(o)]

    def _filter(self, request: web.Request, t: Target) -> Callable[[Obj], bool]:
        labels = parse_labels(request.query.get("labelSelector", ""))
        fields = parse_fields(request.query.get("fieldSelector", ""), t.resource)
        resource, namespace, name = t.resource, t.namespace, t.name

        def passes(obj: Obj) -> bool:
            md = obj["metadata"]
            return (
                (namespace is None or md.get("namespace") == namespace)
                and (name is None or md["name"] == name)
                and labels.matches(md.get("labels") or {})
                and fields.matches(object_fields(obj, resource))
            )

        return passes

    def _list(self, request: web.Request, t: Target) -> Obj:
        items, rv = self._select(request, t), self.store.rv
        start, token_rv = _continue(request.query.get("continue", ""))
        if token_rv is not None:
            if token_rv < self.store.oldest:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent list result. You "
                    "can start a new list without the continue parameter.",
                    "Expired",
                )
            rv = token_rv
            items = [o for o in items if _key(o) > start]
        try:
            limit = int(request.query.get("limit", "0") or 0)
        except ValueError:
            raise ApiError(400, f"invalid limit {request.query['limit']!r}") from None
        body = self._list_body(t.resource, items[:limit] if limit > 0 else items, rv)
        if 0 < limit < len(items):
            last = _key(items[limit - 1])
            token = orjson.dumps({"rv": rv, "start": list(last)})
            body["metadata"]["continue"] = base64.urlsafe_b64encode(token).decode()
            body["metadata"]["remainingItemCount"] = len(items) - limit
        return body

    def _list_body(self, resource: Resource, items: list[Obj], rv: int) -> Obj:
        if self.registry.is_builtin(resource):  # typed lists omit each item's apiVersion/kind
            items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in items]
        return {
            "kind": resource.list_kind,
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion", "")
        initial = _flag(q.get("sendInitialEvents"))
        try:
            since = None if rv in ("", "0") or initial else int(rv)
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        except ValueError:
            raise ApiError(400, f"invalid resource version or timeout: {rv!r}") from None
        params = WatchParams(since, _flag(q.get("allowWatchBookmarks")), timeout, initial)
        stream = WatchStream(self.store, t.resource, self._filter(request, t), params, self.bookmark_every)
        return await self.stream(stream, request)


async def _body(request: web.Request, kind: type) -> Any:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, kind):
        raise ApiError(400, f"the request body must be a JSON {kind.__name__}")
    return body


def _permit(resource: Resource, verb: str, watching: bool) -> None:
    """405 for a verb the resource does not serve (listing TokenReviews, say)."""
    if (("watch" if watching else verb) or "none") not in resource.verbs:
        raise ApiError(
            405, f"the server does not allow this method on the requested resource ({resource.plural})"
        )


def _flag(value: str | None) -> bool:
    """A boolean query parameter, parsed like Go's ``strconv.ParseBool`` (the client sends ``True``)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _key(obj: Obj) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _continue(token: str) -> tuple[tuple[str, str], int | None]:
    if not token:
        return ("", ""), None
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return (str(data["start"][0]), str(data["start"][1])), int(data["rv"])
    except (binascii.Error, orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        raise ApiError(400, "continue key is not valid") from None
