"""What every RBAC binding must satisfy, for the kustomize bases and the Helm chart alike."""

from __future__ import annotations

from typing import Any


def bound_role(binding: dict[str, Any], roles: set[str], where: str) -> str:
    """The ``Kind/name`` of the role ``binding`` grants, after checking that the reference is valid:
    the RBAC API group, a ClusterRoleBinding only to a ClusterRole, and a role that is among
    ``roles`` (those ``where`` — "shipped", "rendered" — provides)."""
    ref = binding["roleRef"]
    assert ref["apiGroup"] == "rbac.authorization.k8s.io"
    if binding["kind"] == "ClusterRoleBinding":
        assert ref["kind"] == "ClusterRole", "a ClusterRoleBinding can only bind a ClusterRole"
    role = f"{ref['kind']}/{ref['name']}"
    assert role in roles, f"{binding['metadata']['name']} binds {role}, which is not {where}"
    return role
