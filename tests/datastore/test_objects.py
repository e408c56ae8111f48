"""Objectives and model rewrites from CRD-shaped YAML (no-Kubernetes mode)."""

from __future__ import annotations

import pytest

from epp.datastore.objects import apply_objects, load_objects
from epp.datastore.store import Datastore
from epp.errors import ConfigError

OBJECTS = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: sql-lora}
spec: {priority: 2, poolRef: {name: vllm-pool}}
---
kind: InferenceObjective
metadata: {name: sheddable}
spec: {priority: -1}
---
kind: InferenceObjective
metadata: {name: other-pool}
spec: {priority: 9, poolRef: {name: another}}
---
kind: InferenceModelRewrite
metadata: {name: rewrite-test, creationTimestamp: "2025-01-01T00:00:00Z"}
spec:
  poolRef: {name: vllm-pool}
  rules:
  - matches: [{model: {type: Exact, value: model-to-be-rewritten}}]
    targets: [{modelRewrite: rewritten-model, weight: 1}]
"""


def test_loads_objectives_and_rewrites_for_this_pool() -> None:
    """Objects for other pools are skipped, as the reconciler skips them."""
    objs = load_objects(OBJECTS, pool_name="vllm-pool")
    assert {o.name: o.priority for o in objs.objectives} == {"sql-lora": 2, "sheddable": -1}
    ds = Datastore()
    apply_objects(ds, objs)
    import random

    d = ds.rewrites.decide("model-to-be-rewritten", random.Random(0))
    assert d is not None and d.target_model == "rewritten-model"


def test_list_kind_is_accepted() -> None:
    """A ``kind: List`` (kubectl get -o yaml) is unpacked."""
    text = "kind: List\nitems:\n- {kind: InferenceObjective, metadata: {name: a}, spec: {priority: 4}}\n"
    assert load_objects(text).objectives[0].priority == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("kind: Pod\nmetadata: {name: x}\n", r"items\[0\]\.kind", id="wrong-kind"),
        pytest.param(
            "kind: InferenceObjective\nspec: {priority: 1}\n", r"metadata: Field required", id="no-meta"
        ),
        pytest.param(
            "kind: InferenceObjective\nmetadata: {name: a}\nspec: {priority: high}\n",
            r"spec\.priority",
            id="type",
        ),
        pytest.param(
            "kind: InferenceModelRewrite\nmetadata: {name: r}\nspec: {rules: [{targets: []}]}\n",
            r"spec\.rules\[0\]\.targets",
            id="no-targets",
        ),
        pytest.param(
            "kind: InferenceObjective\nmetadata: {name: a}\n---\nkind: InferenceObjective\nmetadata: {name: a}\n",
            "duplicate InferenceObjective name 'a'",
            id="duplicate",
        ),
    ],
)
def test_errors_name_the_object_and_field(text: str, message: str) -> None:
    """A bad object is rejected with its index and field path."""
    with pytest.raises(ConfigError, match=message):
        load_objects(text)
