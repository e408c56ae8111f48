"""InferenceObjective / InferenceModelRewrite objects → datastore, matched on spec.poolRef (GIE §7.2)."""

from __future__ import annotations

import random
from typing import Any

from epp.datastore.store import Datastore
from epp.k8s.objectives import ObjectiveHandler, RewriteHandler

GROUP = "inference.networking.k8s.io"


def objective(name: str, priority: int | None, pool: str = "pool", group: str = GROUP) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool, "group": group}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


def rewrite(
    name: str, model: str, target: str, pool: str = "pool", created: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": {
            "poolRef": {"name": pool},
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": model}}],
                    "targets": [{"modelRewrite": target}],
                }
            ],
        },
    }


def test_objective_for_this_pool_is_stored_by_name() -> None:
    ds = Datastore()
    h = ObjectiveHandler(ds, "pool", GROUP)
    h.upsert(objective("chat", 5))
    h.upsert(objective("batch", None))
    assert ds.objective("chat") is not None and ds.objective("chat").priority == 5  # type: ignore[union-attr]
    assert ds.objective("batch").priority == 0  # type: ignore[union-attr]


def test_objective_moving_to_another_pool_or_group_is_removed() -> None:
    ds = Datastore()
    h = ObjectiveHandler(ds, "pool", GROUP)
    h.upsert(objective("chat", 5))
    h.upsert(objective("chat", 5, pool="other"))
    assert ds.objective("chat") is None
    h.upsert(objective("chat", 5))
    h.upsert(objective("chat", 5, group="inference.networking.x-k8s.io"))
    assert ds.objective("chat") is None


def test_objective_delete_and_invalid() -> None:
    ds = Datastore()
    h = ObjectiveHandler(ds, "pool", GROUP)
    h.upsert(objective("chat", 5))
    bad = objective("chat", 5)
    bad["spec"]["priority"] = "high"
    h.upsert(bad)  # logged and dropped, never raises
    assert ds.objective("chat") is None
    h.upsert(objective("chat", 5))
    h.delete(objective("chat", 5))
    assert ds.objective("chat") is None


def test_rewrites_follow_pool_ref_and_precedence() -> None:
    ds = Datastore()
    h = RewriteHandler(ds, "pool", GROUP)
    h.upsert(rewrite("new", "llama", "llama-v2", created="2026-02-01T00:00:00Z"))
    h.upsert(rewrite("old", "llama", "llama-v1", created="2026-01-01T00:00:00Z"))
    h.upsert(rewrite("elsewhere", "qwen", "qwen-v1", pool="other"))
    rng = random.Random(0)
    assert ds.rewrites.decide("llama", rng).target_model == "llama-v1"  # type: ignore[union-attr]
    assert ds.rewrites.decide("qwen", rng) is None
    h.delete(rewrite("old", "llama", "llama-v1"))
    assert ds.rewrites.decide("llama", rng).target_model == "llama-v2"  # type: ignore[union-attr]
