"""GKE's preferred and backup EPPs (llm-d-router's provider.gke.preferredBackends), rendered as its
chart renders them: a StatefulSet whose pods each have a Service, a GCPBackendPolicy naming the
pod's tier and a gRPC HealthCheckPolicy on the EPP's health port."""

from __future__ import annotations

from typing import Any

from epp.server import health
from tests.deploy import test_wiring
from tests.deploy.helm import EPP, RELEASE, args, deployment, one, options, render

Obj = dict[str, Any]
VALUES = "gke-preferred-backends-values.yaml"
# llm-d-router's names: ordinal 0 is the EPP's own Service, then -preferred-<i>, then -backup(-<j>)
SERVICES = {EPP: ("PREFERRED", 0), f"{EPP}-preferred-1": ("PREFERRED", 1), f"{EPP}-backup": ("DEFAULT", 2)}
POLICIES = {
    EPP: RELEASE,
    f"{EPP}-preferred-1": f"{RELEASE}-preferred-1",
    f"{EPP}-backup": f"{RELEASE}-backup",
}


def of_kind(objs: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def test_a_statefulset_of_ready_pods() -> None:
    objs = render(VALUES)
    workload = deployment(objs)
    assert workload["kind"] == "StatefulSet"
    assert not of_kind(objs, "Deployment")
    assert workload["spec"]["replicas"] == len(SERVICES)
    assert workload["spec"]["serviceName"] == EPP
    assert workload["spec"]["podManagementPolicy"] == "Parallel"
    assert options(objs).ha_enable_leader_election is False  # GKE chooses; every pod must be ready
    assert not any("leader-election" in a for a in args(objs))
    ready = test_wiring.epp_container(workload)["readinessProbe"]["grpc"]["service"]
    servicer = health.HealthServicer(lambda: True, leader_election=False, leader=lambda: False)
    assert servicer.status(ready) == health.SERVING


def test_one_service_per_pod() -> None:
    objs = render(VALUES)
    services = of_kind(objs, "Service")
    assert set(services) == set(SERVICES)
    port = options(objs).grpc_port
    for name, (_, ordinal) in SERVICES.items():
        spec = services[name]["spec"]
        assert spec["selector"] == {"statefulset.kubernetes.io/pod-name": f"{EPP}-{ordinal}"}
        neg = services[name]["metadata"]["annotations"]["cloud.google.com/neg"]
        assert neg == f'{{"exposed_ports":{{"{port}":{{}}}}}}'


def test_each_service_has_its_tier_and_health_check() -> None:
    objs = render(VALUES)
    backend = {o["spec"]["targetRef"]["name"]: o for o in of_kind(objs, "GCPBackendPolicy").values()}
    assert set(backend) == set(SERVICES)  # no policy on the pool: the Services carry them
    health_port = options(objs).grpc_health_port
    checks = [
        o for o in objs if o["kind"] == "HealthCheckPolicy" and o["spec"]["targetRef"]["kind"] == "Service"
    ]
    assert {c["spec"]["targetRef"]["name"] for c in checks} == set(SERVICES)
    for name, (tier, _) in SERVICES.items():
        policy = backend[name]
        assert policy["metadata"]["name"] == POLICIES[name]
        assert policy["spec"]["targetRef"] == {"group": "", "kind": "Service", "name": name}
        assert policy["spec"]["default"] == {
            "timeoutSec": 300,
            "backendPreference": tier,
            "balancingMode": "RATE",
            "maxRatePerEndpoint": 100,
            "capacityScalerPercent": 100,
        }
    for check in checks:
        assert check["spec"]["default"]["config"] == {
            "type": "GRPC",
            "grpcHealthCheck": {"portSpecification": "USE_FIXED_PORT", "port": health_port},
        }
    # the model servers' health check on the pool stays
    pool_check = [
        o
        for o in objs
        if o["kind"] == "HealthCheckPolicy" and o["spec"]["targetRef"]["kind"] == "InferencePool"
    ]
    assert len(pool_check) == 1


def test_the_pool_names_a_backup_service() -> None:
    objs = render(VALUES)
    ref = one(objs, "InferencePool")["spec"]["endpointPickerRef"]
    assert ref["name"] == f"{EPP}-backup"  # as llm-d-router's chart
    assert ref["name"] in of_kind(objs, "Service")
