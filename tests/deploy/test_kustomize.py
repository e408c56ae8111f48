"""Every kustomization under deploy/kubernetes builds, and yields exactly the objects it should."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.deploy.kustomize import (
    KUBERNETES,
    KustomizeError,
    build,
    json_patch,
    kubectl_binary,
    kustomization_dirs,
    manifest_files,
    object_id,
    resource_paths,
)

CRDS = [
    "CustomResourceDefinition/inferencepools.inference.networking.k8s.io",
    "CustomResourceDefinition/inferenceobjectives.inference.networking.x-k8s.io",
    "CustomResourceDefinition/inferencemodelrewrites.inference.networking.x-k8s.io",
]
EPP = [
    "ServiceAccount/epp",
    "Role/epp",
    "RoleBinding/epp",
    "ClusterRole/epp-metrics-auth",
    "ClusterRoleBinding/epp-metrics-auth",
    "ClusterRole/epp-metrics-reader",
    "ConfigMap/epp-config",
    "Deployment/epp",
    "Service/epp",
]
LEADER_ELECTION = ["Role/epp-leader-election", "RoleBinding/epp-leader-election"]

# kustomization directory (relative to deploy/kubernetes) → the objects its build yields.
EXPECTED: dict[str, list[str]] = {
    ".": CRDS + EPP,
    "crds": CRDS,
    "epp": EPP,
    "overlays/ha": EPP + LEADER_ELECTION,
    "overlays/active-active": [*EPP, "PodDisruptionBudget/epp", "NetworkPolicy/epp-peers"],
    "examples": [
        "Deployment/vllm-qwen3-32b",
        "InferencePool/vllm-qwen3-32b",
        "InferenceObjective/interactive",
        "InferenceObjective/batch",
        "InferenceModelRewrite/qwen3-alias",
        "GatewayClass/envoy-gateway",
        "Gateway/inference-gateway",
        "HTTPRoute/vllm-qwen3-32b",
    ],
    "no-kubernetes": ["ConfigMap/epp-endpoints", "Deployment/epp", "Service/epp"],
}


def rel(directory: Path) -> str:
    return directory.relative_to(KUBERNETES).as_posix() or "."


def names(objs: list[dict[str, object]]) -> Counter[str]:
    return Counter(f"{object_id(o)[1]}/{object_id(o)[3]}" for o in objs)


def test_every_kustomization_is_listed() -> None:
    assert sorted(rel(d) for d in kustomization_dirs()) == sorted(EXPECTED)


@pytest.mark.parametrize("directory", sorted(EXPECTED))
def test_build_yields_the_expected_objects(directory: str) -> None:
    assert names(build(KUBERNETES / directory)) == Counter(EXPECTED[directory])


@pytest.mark.parametrize("directory", sorted(EXPECTED))
def test_resources_exist_and_are_below_deploy_kubernetes(directory: str) -> None:
    for path in resource_paths(KUBERNETES / directory):
        assert path.exists()
        assert KUBERNETES in path.parents
        assert path.is_file() or (path / "kustomization.yaml").is_file()


def test_every_manifest_is_reachable_from_a_kustomization() -> None:
    listed = {p for d in kustomization_dirs() for p in resource_paths(d) if p.is_file()}
    assert set(manifest_files()) == listed


def test_ha_overlay_patches_the_base_deployment() -> None:
    (base,) = [o for o in build(KUBERNETES / "epp") if o["kind"] == "Deployment"]
    (ha,) = [o for o in build(KUBERNETES / "overlays/ha") if o["kind"] == "Deployment"]
    assert base["spec"]["replicas"] == 1
    assert ha["spec"]["replicas"] == 2
    base_args = base["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ha["spec"]["template"]["spec"]["containers"][0]["args"] == [
        *base_args,
        "--ha-enable-leader-election",
    ]


# --- the walker itself rejects what kustomize would (and what it does not implement) -------------


def write(directory: Path, kustomization: str, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(kustomization)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


HEADER = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"


def test_walker_rejects_a_missing_resource(tmp_path: Path) -> None:
    write(tmp_path, HEADER + "resources: [gone.yaml]\n")
    with pytest.raises(KustomizeError, match="does not exist"):
        build(tmp_path)


def test_walker_rejects_duplicates(tmp_path: Path) -> None:
    write(tmp_path, HEADER + "resources: [a.yaml, b.yaml]\n", **{"a.yaml": CM, "b.yaml": CM})
    with pytest.raises(KustomizeError, match="duplicate"):
        build(tmp_path)


def test_walker_rejects_unimplemented_fields(tmp_path: Path) -> None:
    write(tmp_path, HEADER + "resources: [a.yaml]\nnamePrefix: x-\n", **{"a.yaml": CM})
    with pytest.raises(KustomizeError, match="namePrefix"):
        build(tmp_path)


def test_walker_rejects_a_patch_that_matches_nothing(tmp_path: Path) -> None:
    patch = "patches:\n- target: {kind: ConfigMap, name: b}\n  patch: '[{op: remove, path: /data}]'\n"
    write(tmp_path, HEADER + "resources: [a.yaml]\n" + patch, **{"a.yaml": CM})
    with pytest.raises(KustomizeError, match="matches no object"):
        build(tmp_path)


def test_walker_rejects_a_parent_directory_as_resource(tmp_path: Path) -> None:
    write(tmp_path, HEADER + "resources: [a.yaml]\n", **{"a.yaml": CM})
    write(tmp_path / "overlay", HEADER + "resources: [..]\n")
    with pytest.raises(KustomizeError, match="cycle"):
        build(tmp_path / "overlay")


def test_json_patch_operations() -> None:
    doc = {"a": {"list": [1, 2]}, "b": 1}
    assert json_patch(doc, {"op": "add", "path": "/a/list/-", "value": 3}) == {
        "a": {"list": [1, 2, 3]},
        "b": 1,
    }
    assert json_patch(doc, {"op": "add", "path": "/a/list/0", "value": 0})["a"]["list"] == [0, 1, 2]
    assert json_patch(doc, {"op": "replace", "path": "/b", "value": 2})["b"] == 2
    assert json_patch(doc, {"op": "remove", "path": "/a/list/1"})["a"]["list"] == [1]
    assert doc == {"a": {"list": [1, 2]}, "b": 1}
    with pytest.raises(KustomizeError):
        json_patch(doc, {"op": "replace", "path": "/missing", "value": 1})
    with pytest.raises(KustomizeError):
        json_patch(doc, {"op": "move", "from": "/a", "path": "/c"})


# --- the same result as the real kustomize ---------------------------------------------------------


def canonical(objs: list[dict[str, object]]) -> list[str]:
    return sorted(yaml.safe_dump(o, sort_keys=True) for o in objs)


@pytest.mark.parametrize("directory", sorted(EXPECTED))
def test_walker_agrees_with_kubectl_kustomize(directory: str) -> None:
    """The real kustomize (kubectl v1.30's, fetched by make install) builds the same objects."""
    done = subprocess.run(
        [str(kubectl_binary()), "kustomize", str(KUBERNETES / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    real = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    assert canonical(real) == canonical(build(KUBERNETES / directory))
