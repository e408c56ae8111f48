"""RBAC is exactly GIE's set (inventory §7.7): nothing missing, nothing more.

The base grants what InferencePool mode and metrics auth need; the leases/events rules for
leader election come only with overlays/ha, the one setup that elects a leader; the
EndpointSlice watch only with overlays/active-active, whose replicas find each other. Rules are
compared as flat (role, apiGroup, resource, verb) grants, so splitting or merging rules in
the YAML does not matter but any extra verb or resource does.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import pytest

from tests.deploy.kustomize import KUBERNETES, build
from tests.deploy.rbac import bound_role

Obj = dict[str, Any]
Grant = tuple[
    str, str, str, str
]  # (Role/ClusterRole name, apiGroup or "nonResourceURL", resource or URL, verb)

READ = ("get", "watch", "list")

EPP_ROLE: set[Grant] = {
    *(("Role/epp", "", "pods", v) for v in READ),
    *(("Role/epp", "inference.networking.k8s.io", "inferencepools", v) for v in READ),
    *(("Role/epp", "inference.networking.x-k8s.io", "inferenceobjectives", v) for v in READ),
    *(("Role/epp", "inference.networking.x-k8s.io", "inferencemodelrewrites", v) for v in READ),
}
METRICS_AUTH: set[Grant] = {
    ("ClusterRole/epp-metrics-auth", "authentication.k8s.io", "tokenreviews", "create"),
    ("ClusterRole/epp-metrics-auth", "authorization.k8s.io", "subjectaccessreviews", "create"),
}
METRICS_READER: set[Grant] = {("ClusterRole/epp-metrics-reader", "nonResourceURL", "/metrics", "get")}
LEADER_ELECTION: set[Grant] = {
    *(
        ("Role/epp-leader-election", "coordination.k8s.io", "leases", v)
        for v in ("get", "list", "watch", "create", "update", "patch", "delete")
    ),
    ("Role/epp-leader-election", "", "events", "create"),
    ("Role/epp-leader-election", "", "events", "patch"),
}

# active-active: the peers are the `epp` Service's endpoints (k8s-peer-discovery)
PEERS: set[Grant] = {("Role/epp", "discovery.k8s.io", "endpointslices", v) for v in ("list", "watch")}

EXPECTED = {
    "epp": EPP_ROLE | METRICS_AUTH | METRICS_READER,
    "overlays/ha": EPP_ROLE | METRICS_AUTH | METRICS_READER | LEADER_ELECTION,
    "overlays/active-active": EPP_ROLE | METRICS_AUTH | METRICS_READER | PEERS,
    ".": EPP_ROLE | METRICS_AUTH | METRICS_READER,
}
# role → bound to the EPP's ServiceAccount? (the metrics reader is for the scraper to bind)
BOUND = {
    "Role/epp": True,
    "ClusterRole/epp-metrics-auth": True,
    "ClusterRole/epp-metrics-reader": False,
    "Role/epp-leader-election": True,
}


def grants(objs: list[Obj]) -> set[Grant]:
    out: set[Grant] = set()
    for obj in objs:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        role = f"{obj['kind']}/{obj['metadata']['name']}"
        for rule in obj["rules"]:
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", [])
            assert "resourceNames" not in rule
            if "nonResourceURLs" in rule:
                assert obj["kind"] == "ClusterRole", "nonResourceURLs only work in a ClusterRole"
                assert "apiGroups" not in rule and "resources" not in rule
                out |= {
                    (role, "nonResourceURL", u, v) for u, v in product(rule["nonResourceURLs"], rule["verbs"])
                }
            else:
                out |= set(product([role], rule["apiGroups"], rule["resources"], rule["verbs"]))
    return out


@pytest.mark.parametrize("setup", sorted(EXPECTED))
def test_rules_are_exactly_gies(setup: str) -> None:
    assert grants(build(KUBERNETES / setup)) == EXPECTED[setup]


@pytest.mark.parametrize("setup", sorted(EXPECTED))
def test_bindings_give_the_roles_to_the_epp_only(setup: str) -> None:
    objs = build(KUBERNETES / setup)
    roles = {f"{o['kind']}/{o['metadata']['name']}" for o in objs if o["kind"] in ("Role", "ClusterRole")}
    bound = set()
    for obj in objs:
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = bound_role(obj, roles, "shipped")
        (subject,) = obj["subjects"]
        assert (subject["kind"], subject["name"]) == ("ServiceAccount", "epp")
        if obj["kind"] == "ClusterRoleBinding":
            assert subject["namespace"], "a ClusterRoleBinding's ServiceAccount subject needs a namespace"
        else:
            assert "namespace" not in subject  # defaults to the binding's (the EPP's) namespace
        bound.add(role)
    assert bound == {r for r in roles if BOUND[r]}
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    service_accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] in service_accounts


def test_metrics_auth_rules_ship_with_metrics_auth_on() -> None:
    """--metrics-endpoint-auth is left at its default (on), which is what needs the reviews."""
    (deployment,) = [o for o in build(KUBERNETES / "epp") if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--metrics-endpoint-auth") for a in args)


def test_an_extra_verb_is_caught() -> None:
    objs = build(KUBERNETES / "epp")
    (role,) = [o for o in objs if o["kind"] == "Role"]
    role["rules"][0]["verbs"].append("delete")
    assert grants(objs) != EXPECTED["epp"]
