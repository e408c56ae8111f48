"""InferenceObjective and InferenceModelRewrite objects, shaped like the CRDs (GIE §7.1).

The same models read Kubernetes watch events and the ``--objectives-file`` of no-Kubernetes
mode, so a file can be copied from a cluster with ``kubectl get -o yaml``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epp.datastore.rewrites import ModelRewrite, RewriteRule, RewriteTarget
from epp.datastore.store import Datastore, Objective
from epp.errors import ConfigError
from epp.plugin.registry import format_validation_error

X_GROUP: Final = "inference.networking.x-k8s.io"
POOL_GROUP: Final = "inference.networking.k8s.io"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ObjectMeta(_Model):
    name: str = Field(min_length=1)
    namespace: str = ""
    creation_timestamp: dt.datetime | None = Field(default=None, alias="creationTimestamp")


class PoolRef(_Model):
    group: str = POOL_GROUP
    kind: str = "InferencePool"
    name: str = Field(min_length=1)


class ObjectiveSpec(_Model):
    priority: int | None = None
    pool_ref: PoolRef | None = Field(default=None, alias="poolRef")


class InferenceObjective(_Model):
    api_version: str = Field(default=f"{X_GROUP}/v1alpha2", alias="apiVersion")
    kind: Literal["InferenceObjective"]
    metadata: ObjectMeta
    spec: ObjectiveSpec = Field(default_factory=ObjectiveSpec)


class ModelMatch(_Model):
    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class Match(_Model):
    model: ModelMatch


class Target(_Model):
    model_rewrite: str = Field(alias="modelRewrite", min_length=1)
    weight: int = Field(default=1, ge=0, le=1_000_000)


class Rule(_Model):
    matches: list[Match] = Field(default_factory=list)
    targets: list[Target] = Field(min_length=1)


class RewriteSpec(_Model):
    pool_ref: PoolRef | None = Field(default=None, alias="poolRef")
    rules: list[Rule] = Field(default_factory=list)


class InferenceModelRewrite(_Model):
    api_version: str = Field(default=f"{X_GROUP}/v1alpha2", alias="apiVersion")
    kind: Literal["InferenceModelRewrite"]
    metadata: ObjectMeta
    spec: RewriteSpec = Field(default_factory=RewriteSpec)


@dataclass(frozen=True, slots=True)
class PoolObjects:
    objectives: tuple[Objective, ...]
    rewrites: tuple[ModelRewrite, ...]


def objective_from(obj: InferenceObjective) -> Objective:
    return Objective(name=obj.metadata.name, priority=obj.spec.priority or 0)


def rewrite_from(obj: InferenceModelRewrite) -> ModelRewrite:
    ts = obj.metadata.creation_timestamp
    return ModelRewrite(
        name=obj.metadata.name,
        created=ts.timestamp() if ts is not None else 0.0,
        rules=tuple(
            RewriteRule(
                matches=tuple(m.model.value for m in rule.matches),
                targets=tuple(RewriteTarget(model=t.model_rewrite, weight=t.weight) for t in rule.targets),
            )
            for rule in obj.spec.rules
        ),
    )


def _documents(text: str, source: str) -> list[Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    out: list[Any] = []
    for d in docs:
        if isinstance(d, Mapping) and d.get("kind") == "List":
            out.extend(d.get("items") or [])
        elif isinstance(d, list):
            out.extend(d)
        else:
            out.append(d)
    return out


def load_objects(text: str, *, pool_name: str = "", source: str = "objectives file") -> PoolObjects:
    """Parse InferenceObjective / InferenceModelRewrite documents (multi-doc YAML or a List).

    Objects whose ``spec.poolRef.name`` names another pool are skipped, as the Kubernetes
    reconciler skips them; objects without a poolRef apply to this pool.
    """
    objectives: list[Objective] = []
    rewrites: list[ModelRewrite] = []
    for i, doc in enumerate(_documents(text, source)):
        where = f"{source}: items[{i}]"
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{where}: expected a Kubernetes object mapping")
        kind = doc.get("kind")
        try:
            if kind == "InferenceObjective":
                obj = InferenceObjective.model_validate(doc)
                if _for_pool(obj.spec.pool_ref, pool_name):
                    objectives.append(objective_from(obj))
            elif kind == "InferenceModelRewrite":
                rw = InferenceModelRewrite.model_validate(doc)
                if _for_pool(rw.spec.pool_ref, pool_name):
                    rewrites.append(rewrite_from(rw))
            else:
                raise ConfigError(
                    f"{where}.kind: expected InferenceObjective or InferenceModelRewrite, got {kind!r}"
                )
        except ValidationError as e:
            raise ConfigError(f"{where} ({kind}): {format_validation_error('', e)}") from None
    _no_duplicates([o.name for o in objectives], "InferenceObjective", source)
    _no_duplicates([r.name for r in rewrites], "InferenceModelRewrite", source)
    return PoolObjects(objectives=tuple(objectives), rewrites=tuple(rewrites))


def _for_pool(ref: PoolRef | None, pool_name: str) -> bool:
    return ref is None or not pool_name or ref.name == pool_name


def _no_duplicates(names: Iterable[str], kind: str, source: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ConfigError(f"{source}: duplicate {kind} name {n!r}")
        seen.add(n)


def apply_objects(datastore: Datastore, objects: PoolObjects) -> None:
    datastore.set_objectives(objects.objectives)
    datastore.rewrites.set_all(objects.rewrites)
