"""The chart's RBAC is exactly what each setup needs (test_rbac.py's rule, for every values file).

Pool mode reads pods, the pool, objectives and rewrites; standalone mode only pods. Metrics auth
adds the TokenReview / SubjectAccessReview rights and a /metrics reader role, bound to whoever
scrapes with it: nobody (you bind your Prometheus), the EPP's own ServiceAccount (GIE's
ServiceMonitor presents its token) or GMP's reader on GKE. Leader election adds the Lease;
active-active the EPP Service's EndpointSlices (list and watch: its peers).
"""

from __future__ import annotations

from itertools import product
from typing import Any

import pytest

from tests.deploy.helm import NAMESPACE, RELEASE, options, render, values_files
from tests.deploy.rbac import bound_role

Obj = dict[str, Any]
Grant = tuple[
    str, str, str, str, str
]  # (role, apiGroup or "nonResourceURL", resource or URL, verb, resourceName)

EPP = f"{RELEASE}-epp"
CLUSTER = f"{RELEASE}-{NAMESPACE}-epp"
READ = ("get", "watch", "list")


def role_grants(role: str, group: str, resources: tuple[str, ...], verbs: tuple[str, ...]) -> set[Grant]:
    return {(role, group, r, v, "") for r, v in product(resources, verbs)}


PODS = role_grants(f"Role/{EPP}", "", ("pods",), READ)
POOL = role_grants(f"Role/{EPP}", "inference.networking.k8s.io", ("inferencepools",), READ) | role_grants(
    f"Role/{EPP}", "inference.networking.x-k8s.io", ("inferenceobjectives", "inferencemodelrewrites"), READ
)
METRICS_AUTH = role_grants(
    f"ClusterRole/{CLUSTER}-metrics-auth", "authentication.k8s.io", ("tokenreviews",), ("create",)
) | role_grants(
    f"ClusterRole/{CLUSTER}-metrics-auth", "authorization.k8s.io", ("subjectaccessreviews",), ("create",)
)
METRICS_READER = {(f"ClusterRole/{CLUSTER}-metrics-reader", "nonResourceURL", "/metrics", "get", "")}
LEADER_ELECTION = role_grants(
    f"Role/{EPP}-leader-election",
    "coordination.k8s.io",
    ("leases",),
    ("get", "list", "watch", "create", "update", "patch", "delete"),
) | role_grants(f"Role/{EPP}-leader-election", "", ("events",), ("create", "patch"))
# active-active: the peers are the EPP Service's endpoints (k8s-peer-discovery watches them)
PEERS = role_grants(f"Role/{EPP}", "discovery.k8s.io", ("endpointslices",), ("list", "watch"))
GMP_SECRET = {
    (f"Role/{RELEASE}-metrics-reader-secret-read", "", "secrets", v, f"{RELEASE}-metrics-reader-secret")
    for v in READ
}
BASE = PODS | POOL | METRICS_AUTH | METRICS_READER

EXPECTED: dict[str, set[Grant]] = {
    "default-values.yaml": BASE,
    "ha-values.yaml": BASE | LEADER_ELECTION,
    "active-active-values.yaml": BASE | PEERS,
    "llm-d-active-active-values.yaml": BASE | PEERS,
    "prometheus-values.yaml": BASE,
    "no-metrics-auth-values.yaml": PODS | POOL,
    "custom-config-values.yaml": BASE,
    "tls-values.yaml": BASE,
    "tracing-values.yaml": BASE,
    "istio-values.yaml": BASE,
    "gke-values.yaml": BASE | GMP_SECRET,
    "sglang-values.yaml": BASE,
    "vllm-grpc-values.yaml": BASE,
    "standalone-values.yaml": PODS | METRICS_AUTH | METRICS_READER,
    "latency-predictor-values.yaml": BASE,
    "gie-full-values.yaml": BASE,
    "llm-d-values.yaml": BASE | LEADER_ELECTION,
    "llm-d-standalone-values.yaml": PODS | METRICS_AUTH | METRICS_READER,
    "llm-d-standalone-proxy-values.yaml": PODS | METRICS_AUTH | METRICS_READER,
    "llm-d-tokenizer-values.yaml": BASE,
    "gke-preferred-backends-values.yaml": BASE,
}

EPP_SA = ("ServiceAccount", EPP, NAMESPACE)
# role → who it is bound to, per values file; a role missing here is bound to nobody
BINDINGS: dict[str, dict[str, set[tuple[str, str, str]]]] = {
    name: {
        f"Role/{EPP}": {EPP_SA},
        **({f"ClusterRole/{CLUSTER}-metrics-auth": {EPP_SA}} if grants >= METRICS_AUTH else {}),
        **({f"Role/{EPP}-leader-election": {EPP_SA}} if grants >= LEADER_ELECTION else {}),
    }
    for name, grants in EXPECTED.items()
}
for _name in ("prometheus-values.yaml", "llm-d-values.yaml"):  # the ServiceMonitor scrapes as the EPP
    BINDINGS[_name][f"ClusterRole/{CLUSTER}-metrics-reader"] = {EPP_SA}
BINDINGS["gke-values.yaml"] |= {
    f"ClusterRole/{CLUSTER}-metrics-reader": {("ServiceAccount", f"{RELEASE}-metrics-reader-sa", NAMESPACE)},
    f"Role/{RELEASE}-metrics-reader-secret-read": {("ServiceAccount", "collector", "gke-gmp-system")},
}


def grants(objs: list[Obj]) -> set[Grant]:
    out: set[Grant] = set()
    for obj in objs:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        role = f"{obj['kind']}/{obj['metadata']['name']}"
        for rule in obj["rules"]:
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", [])
            names = rule.get("resourceNames", [""])
            if "nonResourceURLs" in rule:
                assert obj["kind"] == "ClusterRole", "nonResourceURLs only work in a ClusterRole"
                assert "apiGroups" not in rule and "resources" not in rule
                out |= {
                    (role, "nonResourceURL", u, v, "")
                    for u, v in product(rule["nonResourceURLs"], rule["verbs"])
                }
            else:
                out |= set(product([role], rule["apiGroups"], rule["resources"], rule["verbs"], names))
    return out


def test_every_values_file_has_its_expected_rbac() -> None:
    assert set(EXPECTED) == set(values_files())


@pytest.mark.parametrize("values", sorted(EXPECTED))
def test_rules_are_exactly_what_the_setup_needs(values: str) -> None:
    assert grants(render(values)) == EXPECTED[values]


@pytest.mark.parametrize("values", sorted(EXPECTED))
def test_bindings_give_each_role_to_its_user_only(values: str) -> None:
    objs = render(values)
    roles = {f"{o['kind']}/{o['metadata']['name']}" for o in objs if o["kind"] in ("Role", "ClusterRole")}
    bound: dict[str, set[tuple[str, str, str]]] = {}
    for obj in objs:
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = bound_role(obj, roles, "rendered")
        for s in obj["subjects"]:
            assert s["kind"] == "ServiceAccount"
            if obj["kind"] == "ClusterRoleBinding":
                assert s.get("namespace"), "a ClusterRoleBinding's ServiceAccount subject needs a namespace"
            bound.setdefault(role, set()).add((s["kind"], s["name"], s.get("namespace", NAMESPACE)))
    assert bound == BINDINGS[values]


def test_an_extra_verb_is_caught() -> None:
    objs = render("default-values.yaml")
    (role,) = [o for o in objs if o["kind"] == "Role"]
    role["rules"][0]["verbs"].append("delete")
    assert grants(objs) != EXPECTED["default-values.yaml"]


def test_metrics_auth_off_is_passed_to_the_epp() -> None:
    """No review rights without --metrics-endpoint-auth=false: the EPP would fail every scrape."""
    assert options(render("no-metrics-auth-values.yaml")).metrics_endpoint_auth is False
    assert options(render("default-values.yaml")).metrics_endpoint_auth is True
