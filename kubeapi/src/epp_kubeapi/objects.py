"""Pod and InferencePool objects (dicts) as a cluster holds them: for tests and benchmarks that feed
the fake API server or the reconcilers directly."""

from __future__ import annotations

from typing import Any


def pod(
    name: str,
    ip: str = "10.0.0.1",
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
    rv: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": "vllm"} if labels is None else labels,
    }
    if rv:  # the API server assigns one; reconciler tests set it themselves
        meta["resourceVersion"] = rv
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}, "status": status}


def inference_pool(
    name: str = "pool",
    *,
    ports: tuple[int, ...] = (8000,),
    selector: dict[str, str] | None = None,
    namespace: str = "default",
    app_protocol: str = "",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "vllm"} if selector is None else selector},
        "targetPorts": [{"number": p} for p in ports],
        "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
    }
    if app_protocol:
        spec["appProtocol"] = app_protocol
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
