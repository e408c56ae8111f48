"""The Helm chart (deploy/helm/inferencepool) through the real helm and the deploy validation.

Every documented values file (deploy/helm/inferencepool/ci/) must pass ``helm lint --strict``
and render objects the API server would accept (Kubernetes' schemas, our CRDs and their CEL
rules), with EPP args its own flag parser takes, probes it answers, a config it loads and RBAC
that is exactly what the setup needs. The same values give the same objects as the kustomize
bases where both exist.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from typing import Any

import pytest
import yaml

from epp.app.build import BuildOptions
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.server import health
from tests.deploy import test_manifests, test_wiring
from tests.deploy.helm import (
    EPP,
    NAMESPACE,
    RELEASE,
    container_env,
    deployment,
    one,
    options,
    render,
    run_helm,
    values_files,
)
from tests.deploy.kustomize import KUBERNETES, REPO, build
from tests.deploy.schemas import KUBERNETES_VERSIONS, SchemaMissing, validate_builtin, validate_custom

Obj = dict[str, Any]

VALUES = values_files()
# Every replica ready and routing (issue 30): no leader election, peers over the Service's `peer` port.
ACTIVE_ACTIVE = {"active-active-values.yaml", "llm-d-active-active-values.yaml"}
# GKE's preferred and backup EPPs: a StatefulSet, every pod ready, one Service per pod.
PREFERRED_BACKENDS = "gke-preferred-backends-values.yaml"
# Kinds with no schema offline, each checked by a pointed test below; anything else must validate.
NO_SCHEMA = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("networking.istio.io/v1beta1", "DestinationRule"),
    ("networking.gke.io/v1", "HealthCheckPolicy"),
    ("networking.gke.io/v1", "GCPBackendPolicy"),
    ("monitoring.googleapis.com/v1", "PodMonitoring"),
}
# --- helm itself ----------------------------------------------------------------------------------


def test_helm_is_the_pinned_release() -> None:
    out = run_helm("version", "--short")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("v3.17.1+"), out.stdout


def test_every_documented_values_file_is_here() -> None:
    assert len(VALUES) >= 15
    assert "default-values.yaml" in VALUES and "llm-d-values.yaml" in VALUES


@pytest.mark.parametrize("values", VALUES)
def test_lint_is_clean(values: str) -> None:
    from tests.deploy.helm import CHART, VALUES_DIR

    out = run_helm(
        "lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--values", str(VALUES_DIR / values)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[ERROR]" not in out.stdout and "[WARNING]" not in out.stdout, out.stdout


# --- what the API server would say -----------------------------------------------------------------


@cache
def _errors(obj_json: str, version: str) -> tuple[str, ...]:
    """Validation errors, once per distinct object: most objects are the same in many values files."""
    obj = json.loads(obj_json)
    try:
        return tuple(validate_custom(obj, test_manifests.our_crds()))
    except SchemaMissing:
        return tuple(validate_builtin(obj, version))  # SchemaMissing here: an unknown kind, a failure


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES)
def test_rendered_objects_validate(values: str, version: str) -> None:
    for obj in render(values):
        name = f"{values}: {obj['kind']}/{obj['metadata']['name']}"
        assert obj["metadata"].get("namespace", NAMESPACE) == NAMESPACE, name
        if (obj["apiVersion"], obj["kind"]) in NO_SCHEMA:
            continue
        assert _errors(json.dumps(obj, sort_keys=True), version) == (), name


def test_a_broken_render_is_caught() -> None:
    """The validation above is not vacuous: a rendered object with a typo fails it."""
    objs = render("default-values.yaml")
    test_wiring.epp_container(deployment(objs))["readinesProbe"] = {"grpc": {"port": 9003}}
    assert validate_builtin(deployment(objs), KUBERNETES_VERSIONS[-1]) != []
    pool = one(objs, "InferencePool")
    pool["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    assert validate_custom(pool, test_manifests.our_crds()) != []


# --- the EPP's flags, probes, ports and config ----------------------------------------------------


@pytest.mark.parametrize("values", VALUES)
def test_args_parse_with_the_epps_flag_parser(values: str) -> None:
    objs = render(values)
    opts = options(objs)
    if "standalone" in values:
        assert opts.mode == "selector"
        assert not [o for o in objs if o["kind"] == "InferencePool"]
    else:
        assert opts.mode == "pool"
        pool = one(objs, "InferencePool")
        assert (opts.pool_name, opts.pool_namespace) == (pool["metadata"]["name"], NAMESPACE)
        assert opts.pool_group == pool["apiVersion"].split("/")[0]


@pytest.mark.parametrize("values", VALUES)
def test_probes_and_ports_are_the_epps(values: str) -> None:
    objs = render(values)
    opts = options(objs)
    container = test_wiring.epp_container(deployment(objs))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {k: ports[k] for k in ("grpc", "grpc-health", "metrics")} == {
        "grpc": opts.grpc_port,
        "grpc-health": opts.grpc_health_port,
        "metrics": opts.metrics_port,
    }
    live, ready = container["livenessProbe"]["grpc"], container["readinessProbe"]["grpc"]
    assert live["port"] == ready["port"] == opts.grpc_health_port
    if opts.ha_enable_leader_election:
        assert (live["service"], ready["service"]) == (health.LIVENESS, health.READINESS)
    else:
        assert live["service"] == ready["service"] == test_wiring.GIE_PROBE_SERVICE
    pod = deployment(objs)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > opts.shutdown_grace_period


@pytest.mark.parametrize("values", VALUES)
def test_the_config_file_is_mounted_and_builds(values: str) -> None:
    """The config the EPP would load builds, every plugin with its parameters, as at its start."""
    objs = render(values)
    opts = options(objs)
    text = test_wiring.mounted_file(deployment(objs), objs, opts.config_file)
    env = container_env(test_wiring.epp_container(deployment(objs)))
    components = build_components(
        load_config(text), default_registry(), BuildOptions(metrics=opts.model_server_metrics, env=env)
    )
    assert components.scheduler.profiles


def test_the_default_config_is_the_projects_default() -> None:
    """GIE's default plugins, as config/default.yaml (and so the kustomize ConfigMap) has them."""
    objs = render("default-values.yaml")
    text = test_wiring.mounted_file(deployment(objs), objs, options(objs).config_file)
    assert yaml.safe_load(text) == yaml.safe_load((REPO / "config" / "default.yaml").read_text())


@pytest.mark.parametrize("values", VALUES)
def test_leader_election_follows_the_replicas(values: str) -> None:
    objs = render(values)
    replicas = deployment(objs)["spec"]["replicas"]
    opts = options(objs)
    expected = replicas > 1 and values not in ACTIVE_ACTIVE and values != PREFERRED_BACKENDS
    assert opts.ha_enable_leader_election == expected
    lease_roles = [
        o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader-election")
    ]
    assert bool(lease_roles) == expected


@pytest.mark.parametrize("values", VALUES)
def test_service_and_pool_reach_the_epp(values: str) -> None:
    objs = render(values)
    dep = deployment(objs)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in test_wiring.epp_container(dep)["ports"]}
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert EPP in services
    for service in services.values():
        selector = dict(service["spec"]["selector"])
        pod = selector.pop("statefulset.kubernetes.io/pod-name", None)
        if pod is not None:  # one pod of the StatefulSet (the controller adds this label)
            assert dep["kind"] == "StatefulSet"
            assert pod in {f"{EPP}-{i}" for i in range(dep["spec"]["replicas"])}
        assert selector.items() <= labels.items()
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert ports[by_name["grpc-ext-proc"]["targetPort"]] == options(objs).grpc_port
        assert by_name["grpc-ext-proc"]["appProtocol"] == "http2"
    assert (
        dep["spec"]["template"]["spec"]["serviceAccountName"]
        == one(objs, "ServiceAccount", EPP)["metadata"]["name"]
    )
    for pool in (o for o in objs if o["kind"] == "InferencePool"):
        ref = pool["spec"]["endpointPickerRef"]
        assert ref["name"] == (f"{EPP}-backup" if values == PREFERRED_BACKENDS else EPP)
        by_name = {p["name"]: p for p in services[ref["name"]]["spec"]["ports"]}
        assert ref["port"]["number"] == by_name["grpc-ext-proc"]["port"]
    for obj in objs:
        if obj["kind"] == "InferenceObjective":
            assert obj["spec"]["poolRef"] == {"group": "inference.networking.k8s.io", "name": RELEASE}


@pytest.mark.parametrize("values", VALUES)
def test_pod_shape_is_the_kustomize_bases(values: str) -> None:
    """Hardened as deploy/kubernetes/epp: non-root, read-only root, a memory /tmp for the certificate."""
    ours = build(KUBERNETES / "epp")
    base = one(ours, "Deployment", "epp")["spec"]["template"]["spec"]
    pod = deployment(render(values))["spec"]["template"]["spec"]
    assert pod["securityContext"] == base["securityContext"]
    container, base_container = (
        test_wiring.epp_container({"spec": {"template": {"spec": pod}}}),
        base["containers"][0],
    )
    assert container["securityContext"] == base_container["securityContext"]
    tmp = {v["name"]: v for v in pod["volumes"]}["tmp"]
    assert tmp == {v["name"]: v for v in base["volumes"]}["tmp"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    workload = deployment(render(values))
    if values == PREFERRED_BACKENDS:  # a StatefulSet: pods one at a time (its default), stable names
        assert workload["kind"] == "StatefulSet" and "updateStrategy" not in workload["spec"]
        return
    strategy = workload["spec"]["strategy"]
    if values in ACTIVE_ACTIVE:  # every replica serves: one new pod before an old one goes
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    else:  # one active picker (GIE's chart): a rolling update would keep the old leader alive
        assert strategy == {"type": "Recreate"}


def kinds(objs: list[Obj]) -> Counter[str]:
    return Counter(o["kind"] for o in objs)


@pytest.mark.parametrize(
    ("values", "setup"),
    [
        ("default-values.yaml", "epp"),
        ("ha-values.yaml", "overlays/ha"),
        ("active-active-values.yaml", "overlays/active-active"),
    ],
)
def test_the_same_objects_as_kustomize(values: str, setup: str) -> None:
    """The chart renders what the kustomize base applies, plus the InferencePool (examples/)."""
    expected = kinds(build(KUBERNETES / setup)) + Counter({"InferencePool": 1})
    extra = {
        "overlays/ha": Counter({"PodDisruptionBudget": 1}),
        # the peer secret: the chart makes it, the overlay's user creates it (kustomize cannot draw one)
        "overlays/active-active": Counter({"Secret": 1}),
    }.get(setup, Counter())
    assert kinds(render(values)) == expected + extra


def test_docs_describe_every_values_file() -> None:
    docs = (REPO / "docs" / "helm.md").read_text()
    missing = [v for v in VALUES if f"`{v}`" not in docs]
    assert missing == [], "docs/helm.md's table of values files lacks these"
