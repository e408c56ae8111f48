"""InferenceObjective and InferenceModelRewrite objects → the datastore (GIE §7.2).

Both are stored by name (namespace ignored, as GIE does) when ``spec.poolRef`` names this pool
in this pool's group, and removed when they stop doing so or are deleted.  The same pydantic
models read the ``--objectives-file`` of no-Kubernetes mode.  An invalid object is logged and
skipped, never fatal: one bad object must not stop the EPP from serving the others.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from pydantic import ValidationError

from epp.datastore.objects import (
    InferenceModelRewrite,
    InferenceObjective,
    PoolRef,
    objective_from,
    rewrite_from,
)
from epp.datastore.store import Datastore
from epp.k8s.reflector import Obj, object_key

log = structlog.get_logger(__name__)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


class _PoolRefHandler:
    def __init__(self, datastore: Datastore, pool_name: str, pool_group: str) -> None:
        self._ds = datastore
        self._pool_name = pool_name
        self._pool_group = pool_group

    def _ours(self, ref: PoolRef | None) -> bool:
        return ref is not None and ref.name == self._pool_name and ref.group == self._pool_group

    def synced(self) -> None:
        pass


class ObjectiveHandler(_PoolRefHandler):
    def upsert(self, obj: Obj) -> None:
        try:
            parsed = InferenceObjective.model_validate({"kind": "InferenceObjective", **obj})
        except ValidationError as e:
            log.error("objective_invalid", object=object_key(obj), error=str(e).splitlines()[0])  # noqa: TRY400
            self._ds.remove_objective(_name(obj))
            return
        if self._ours(parsed.spec.pool_ref):
            self._ds.upsert_objective(objective_from(parsed))
        else:
            self._ds.remove_objective(parsed.metadata.name)

    def delete(self, obj: Obj) -> None:
        self._ds.remove_objective(_name(obj))


class RewriteHandler(_PoolRefHandler):
    def upsert(self, obj: Obj) -> None:
        try:
            parsed = InferenceModelRewrite.model_validate({"kind": "InferenceModelRewrite", **obj})
        except ValidationError as e:
            log.error("model_rewrite_invalid", object=object_key(obj), error=str(e).splitlines()[0])  # noqa: TRY400
            self._ds.rewrites.remove(_name(obj))
            return
        if self._ours(parsed.spec.pool_ref):
            self._ds.rewrites.upsert(rewrite_from(parsed))
        else:
            self._ds.rewrites.remove(parsed.metadata.name)

    def delete(self, obj: Obj) -> None:
        self._ds.rewrites.remove(_name(obj))


def replay(store: dict[str, Obj], upsert: Callable[[Obj], None]) -> None:
    """Re-apply every known object (after the pool reappeared and the datastore was cleared)."""
    for obj in list(store.values()):
        upsert(obj)
