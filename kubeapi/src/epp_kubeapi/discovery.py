"""Discovery documents (``/api``, ``/apis``, ``/apis/{group}/{version}``, ``/version``).

Clients probe these to learn whether an optional CRD is installed; an unregistered
group/version must be a 404 ``Status``, never an empty list.
"""

from __future__ import annotations

from typing import Any

from .resources import Registry
from .status import ApiError

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-epp-kubeapi",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def core_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def group_list(registry: Registry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in registry.groups().items()],
    }


def group(registry: Registry, name: str) -> dict[str, Any]:
    versions = registry.groups().get(name)
    if versions is None:
        raise ApiError(404, "the server could not find the requested resource")
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def resource_list(registry: Registry, group_name: str, version: str) -> dict[str, Any]:
    resources = registry.resources(group_name, version)
    if not resources:
        raise ApiError(404, "the server could not find the requested resource")
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{version}" if group_name else version,
        "resources": [entry for r in resources for entry in r.discovery()],
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}
