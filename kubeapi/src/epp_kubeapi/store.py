"""Objects, the global resourceVersion and the event history watches resume from.

Like etcd, one revision counter spans every resource, every write bumps it, and history
is kept only back to a compaction point: resuming from before it is a 410. Writes fan
their event out to subscribed watch queues synchronously, so a watch that subscribes and
snapshots in one step can never miss or duplicate an event.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from .resources import Resource
from .status import AlreadyExists, ApiError, Conflict, Expired, NotFound

Obj = dict[str, Any]
StatusMode = Literal["all", "spec", "status"]


@dataclass(frozen=True, slots=True)
class Event:
    """One committed write: ``obj`` after it (DELETED: the last state at the delete's RV), ``prev`` before."""

    rv: int
    resource: Resource
    type: str
    obj: Obj
    prev: Obj | None


@dataclass(frozen=True, slots=True)
class End:
    """Tells a watch to finish: with an ERROR ``status`` event first when given."""

    status: Obj | None = None


@dataclass(eq=False)
class Subscription:
    """A watch's inbox: events of one resource, then possibly an ``End``."""

    resource: Resource
    queue: asyncio.Queue[Event | End] = field(default_factory=asyncio.Queue)


class ObjectStore:
    """Every object of every resource; stored dicts are never mutated, callers get copies."""

    def __init__(self, history: int = 10_000) -> None:
        self._objects: dict[tuple[str, str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history: deque[Event] = deque()
        self._history_limit = history
        self._oldest = 0  # events after this RV are all still in history
        self._subscriptions: set[Subscription] = set()

    @property
    def rv(self) -> int:
        """The current global resourceVersion (etcd's revision)."""
        return self._rv

    @property
    def oldest(self) -> int:
        """The compaction point: every event after this resourceVersion is still in history."""
        return self._oldest

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        return self._objects.get(resource.key, {}).get((namespace, name))

    def objects(self, resource: Resource, namespace: str | None = None) -> list[Obj]:
        """Objects in name order (namespace, then name), as etcd's key order gives."""
        objects = self._objects.get(resource.key, {})
        return [objects[k] for k in sorted(objects) if namespace is None or k[0] == namespace]

    def create(self, resource: Resource, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        if not md.get("name"):
            if not md.get("generateName"):
                raise ApiError(
                    422,
                    f"{resource.kind} is invalid: metadata.name: Required value: name or "
                    "generateName is required",
                )
            md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
        namespace = md.get("namespace", "") if resource.namespaced else ""
        if resource.namespaced and not namespace:
            raise ApiError(400, "the server could not find the requested resource: namespace is required")
        if not resource.namespaced:
            md.pop("namespace", None)
        key = (namespace, md["name"])
        if key in self._objects.get(resource.key, {}):
            raise AlreadyExists(resource, md["name"])
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        md["generation"] = 1
        md.pop("deletionTimestamp", None)
        return self._commit(resource, key, "ADDED", obj, None)

    def replace(self, resource: Resource, obj: Obj, mode: StatusMode = "all") -> Obj:
        """Full replace. ``mode`` "spec" keeps the stored status, "status" changes only the status."""
        md = obj.get("metadata", {})
        namespace, name = (md.get("namespace", "") if resource.namespaced else ""), md.get("name", "")
        old = self.get(resource, namespace, name)
        if old is None:
            raise NotFound(resource, name)
        if md.get("resourceVersion") and md["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise Conflict(resource, name)
        if mode == "status":
            new = copy.deepcopy(old)
            new.pop("status", None)
            if "status" in obj:
                new["status"] = copy.deepcopy(obj["status"])
        else:
            new = copy.deepcopy(obj)
            if mode == "spec":
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        new_md = new.setdefault("metadata", {})
        for immutable in ("uid", "creationTimestamp", "generation", "resourceVersion"):
            new_md[immutable] = old["metadata"][immutable]
        if not resource.namespaced:
            new_md.pop("namespace", None)
        if new == old:
            return old  # a no-op write neither bumps the resourceVersion nor emits an event
        if _spec(new, resource) != _spec(old, resource):
            new_md["generation"] = old["metadata"]["generation"] + 1
        return self._commit(resource, (namespace, name), "MODIFIED", new, old)

    def delete(self, resource: Resource, namespace: str, name: str, preconditions: Obj | None = None) -> Obj:
        old = self.get(resource, namespace, name)
        if old is None:
            raise NotFound(resource, name)
        pre = preconditions or {}
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise Conflict(resource, name)
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise Conflict(resource, name)
        return self._commit(resource, (namespace, name), "DELETED", copy.deepcopy(old), old)

    def compact(self) -> None:
        """Forget all history: resuming from any RV before now is a 410; open watches end with one."""
        self._history.clear()
        self._oldest = self._rv
        expired = Expired(self._oldest - 1, self._oldest).status()
        for sub in self._subscriptions:
            sub.queue.put_nowait(End(expired))

    def subscribe(self, resource: Resource, since: int | None) -> tuple[Subscription, list[Event]]:
        """Open a watch inbox; with ``since``, also the history after it (410 when compacted away)."""
        replay: list[Event] = []
        if since is not None:
            if since < self._oldest:
                raise Expired(since, self._oldest)
            replay = [e for e in self._history if e.rv > since and e.resource.key == resource.key]
        sub = Subscription(resource)
        self._subscriptions.add(sub)
        return sub, replay

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)

    def end_all(self, status: Obj | None = None) -> None:
        for sub in self._subscriptions:
            sub.queue.put_nowait(End(status))

    def _commit(self, resource: Resource, key: tuple[str, str], kind: str, obj: Obj, prev: Obj | None) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        objects = self._objects.setdefault(resource.key, {})
        if kind == "DELETED":
            del objects[key]
        else:
            objects[key] = obj
        event = Event(self._rv, resource, kind, obj, prev)
        self._history.append(event)
        if len(self._history) > self._history_limit:
            self._oldest = self._history.popleft().rv
        for sub in self._subscriptions:
            if sub.resource.key == resource.key:
                sub.queue.put_nowait(event)
        return obj


def _spec(obj: Obj, resource: Resource) -> Obj:
    """What bumps ``metadata.generation``: everything but metadata (and status, if a subresource)."""
    skip = {"metadata", "status"} if resource.status_subresource else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}
