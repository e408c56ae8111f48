"""The manifests fit the EPP and each other.

* The Deployment's args parse with the EPP's own flag parser, after Kubernetes' $(VAR)
  expansion from the container's env, so a manifest never ships a flag the EPP rejects.
* Probes ask the health ports and service names the EPP answers (epp.server.health), with
  GIE's names: ``inference-extension`` without leader election, ``liveness`` / ``readiness``
  with it.
* Files named by flags exist in mounted ConfigMaps; the ConfigMap's EndpointPickerConfig is
  config/default.yaml and loads with the EPP's config loader.
* Names line up: Service → Pods, InferencePool → EPP Service and model-server Pods, the
  EPP's --pool-name → the pool, objectives / rewrites / HTTPRoute → the pool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from epp.cli.flags import Options, parse_flags
from epp.config.load import load_config
from epp.errors import ConfigError
from epp.server import health
from tests.deploy.kustomize import KUBERNETES, REPO, build

Obj = dict[str, Any]

NAMESPACE = "inference"
POD_NAME = "epp-7d4b9c6f58-x2kqv"
GIE_PROBE_SERVICE = "inference-extension"  # GIE's chart, without leader election (inventory §9.3)

EPP_SETUPS = ["epp", "overlays/ha", "no-kubernetes"]


def objects(directory: str) -> list[Obj]:
    return build(KUBERNETES / directory)


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def epp_container(deployment: Obj) -> Obj:
    containers: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "epp"]
    return container


def container_env(container: Obj) -> dict[str, str]:
    """The container's env as the kubelet would set it, with the downward API resolved."""
    downward = {"metadata.namespace": NAMESPACE, "metadata.name": POD_NAME}
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args: defined variables only, $$ escapes."""

    def one_var(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one_var, arg)


def parsed_options(deployment: Obj) -> Options:
    container = epp_container(deployment)
    assert "command" not in container, "the image's entrypoint is the epp; pass flags as args"
    env = container_env(container)
    args = [expand(a, env) for a in container["args"]]
    assert not any("$(" in a for a in args), f"unexpanded variable in {args}"
    return parse_flags(args, env)


def mounted_file(deployment: Obj, objs: list[Obj], path: str) -> str:
    """The text the container sees at ``path``, from the ConfigMap volume mounted above it."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in epp_container(deployment).get("volumeMounts", []):
        mount_path = PurePosixPath(mount["mountPath"])
        if mount_path in PurePosixPath(path).parents:
            config_map = volumes[mount["name"]]["configMap"]["name"]
            key = PurePosixPath(path).relative_to(mount_path).as_posix()
            data = one(objs, "ConfigMap", config_map)["data"]
            assert key in data, f"ConfigMap {config_map} has no key {key}"
            return str(data[key])
    raise AssertionError(f"{path} is not inside a mounted volume")


# --- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", EPP_SETUPS)
def test_args_parse_with_the_epps_flag_parser(setup: str) -> None:
    objs = objects(setup)
    deployment = one(objs, "Deployment", "epp")
    opts = parsed_options(deployment)
    assert opts.ha_enable_leader_election == (deployment["spec"]["replicas"] > 1)
    if setup == "no-kubernetes":
        assert opts.mode == "endpoints-file"
        mounted_file(deployment, objs, opts.endpoints_file)
        mounted_file(deployment, objs, opts.objectives_file)
    else:
        assert opts.mode == "pool"
        assert opts.pool_namespace == NAMESPACE  # from the downward API, not a fixed name
        assert opts.pool_group == "inference.networking.k8s.io"


def test_pool_mode_names_the_example_pool() -> None:
    opts = parsed_options(one(objects("epp"), "Deployment", "epp"))
    pool = one(objects("examples"), "InferencePool")
    assert opts.pool_name == pool["metadata"]["name"]


def test_a_flag_the_epp_rejects_fails_the_check() -> None:
    deployment = one(objects("epp"), "Deployment", "epp")
    epp_container(deployment)["args"].append("--objectives-file=/config/objectives.yaml")
    with pytest.raises(ConfigError, match="objectives-file"):
        parsed_options(deployment)
    epp_container(deployment)["args"][-1] = "--no-such-flag"
    with pytest.raises(ConfigError):
        parsed_options(deployment)


def test_downward_api_env_as_gie() -> None:
    for setup in ("epp", "overlays/ha"):
        container = epp_container(one(objects(setup), "Deployment", "epp"))
        refs = {
            v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"] for v in container["env"] if "valueFrom" in v
        }
        assert refs == {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}


# --- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", ["epp", "overlays/ha"])
def test_config_file_is_the_default_config(setup: str) -> None:
    objs = objects(setup)
    deployment = one(objs, "Deployment", "epp")
    text = mounted_file(deployment, objs, parsed_options(deployment).config_file)
    assert text == (REPO / "config" / "default.yaml").read_text()
    cfg = load_config(text)
    assert [p.name for p in cfg.scheduling_profiles] == ["default"]


# --- ports, probes and health --------------------------------------------------------------------


def container_ports(container: Obj) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize("setup", EPP_SETUPS)
def test_ports_are_the_epps(setup: str) -> None:
    deployment = one(objects(setup), "Deployment", "epp")
    opts = parsed_options(deployment)
    ports = container_ports(epp_container(deployment))
    assert ports == {
        "grpc": opts.grpc_port,
        "grpc-health": opts.grpc_health_port,
        "metrics": opts.metrics_port,
    }
    assert ports == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}


@pytest.mark.parametrize("setup", EPP_SETUPS)
def test_probes_ask_the_health_service_the_epp_answers(setup: str) -> None:
    deployment = one(objects(setup), "Deployment", "epp")
    opts = parsed_options(deployment)
    container = epp_container(deployment)
    live, ready = container["livenessProbe"]["grpc"], container["readinessProbe"]["grpc"]
    assert live["port"] == ready["port"] == opts.grpc_health_port
    if opts.ha_enable_leader_election:
        assert (live["service"], ready["service"]) == (health.LIVENESS, health.READINESS)
    else:
        assert live["service"] == ready["service"] == GIE_PROBE_SERVICE


@pytest.mark.parametrize("setup", EPP_SETUPS)
def test_probe_answers_follow_readiness_and_leadership(setup: str) -> None:
    """What the kubelet would get back from the EPP's health servicer, in each state."""
    deployment = one(objects(setup), "Deployment", "epp")
    le = parsed_options(deployment).ha_enable_leader_election
    container = epp_container(deployment)
    live, ready = (
        container["livenessProbe"]["grpc"]["service"],
        container["readinessProbe"]["grpc"]["service"],
    )

    def status(service: str, *, is_ready: bool, is_leader: bool) -> object:
        servicer = health.HealthServicer(lambda: is_ready, leader_election=le, leader=lambda: is_leader)
        return servicer.status(service)

    assert status(ready, is_ready=True, is_leader=True) == health.SERVING
    assert status(ready, is_ready=False, is_leader=True) == health.NOT_SERVING
    if le:
        assert status(ready, is_ready=True, is_leader=False) == health.NOT_SERVING  # standbys get no traffic
        assert status(live, is_ready=False, is_leader=False) == health.SERVING  # nor are they restarted
    else:
        assert status(live, is_ready=True, is_leader=True) == health.SERVING


@pytest.mark.parametrize("setup", ["epp", "overlays/ha"])
def test_deployment_shape(setup: str) -> None:
    deployment = one(objects(setup), "Deployment", "epp")
    pod = deployment["spec"]["template"]["spec"]
    container = epp_container(deployment)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["replicas"] == (2 if setup == "overlays/ha" else 1)
    assert pod["serviceAccountName"] == "epp"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}  # TLS key material, read-only root
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    grace = parsed_options(deployment).shutdown_grace_period
    assert pod["terminationGracePeriodSeconds"] > grace


# --- services and references ---------------------------------------------------------------------


@pytest.mark.parametrize("setup", EPP_SETUPS)
def test_service_reaches_the_epp_pods(setup: str) -> None:
    objs = objects(setup)
    deployment = one(objs, "Deployment", "epp")
    service = one(objs, "Service", "epp")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = container_ports(epp_container(deployment))
    by_port = {p["port"]: p for p in service["spec"]["ports"]}
    assert set(by_port) == {9002, 9090}
    assert by_port[9002]["appProtocol"] == "http2"
    for p in by_port.values():
        assert ports[p["targetPort"]] == p["port"]


def test_pool_selects_the_model_servers_and_names_the_epp() -> None:
    examples = objects("examples")
    pool = one(examples, "InferencePool")
    vllm = one(examples, "Deployment")
    pod_labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    served = {p["containerPort"] for c in vllm["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= served
    ref = pool["spec"]["endpointPickerRef"]
    service = one(objects("epp"), "Service", ref["name"])
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""


def test_objectives_rewrites_and_route_point_at_the_pool() -> None:
    examples = objects("examples")
    pool = one(examples, "InferencePool")["metadata"]["name"]
    for obj in examples:
        if obj["kind"] in ("InferenceObjective", "InferenceModelRewrite"):
            ref = obj["spec"]["poolRef"]
            assert ref["name"] == pool
            assert ref.get("group", "inference.networking.k8s.io") == "inference.networking.k8s.io"
            assert ref.get("kind", "InferencePool") == "InferencePool"


def test_gateway_api_example_as_gie_documents_it() -> None:
    """No Gateway API schemas offline: check the fields that make the route reach the pool."""
    examples = objects("examples")
    pool = one(examples, "InferencePool")["metadata"]["name"]
    gateway_class = one(examples, "GatewayClass")
    gateway = one(examples, "Gateway")
    route = one(examples, "HTTPRoute")
    for obj in (gateway_class, gateway, route):
        assert obj["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert gateway_class["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
    assert gateway["spec"]["gatewayClassName"] == gateway_class["metadata"]["name"]
    assert [(lst["protocol"], lst["port"]) for lst in gateway["spec"]["listeners"]] == [("HTTP", 80)]
    (parent,) = route["spec"]["parentRefs"]
    assert parent == {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "name": gateway["metadata"]["name"],
    }
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool}
    ]
    assert set(rule) == {"matches", "backendRefs", "timeouts"}
    assert set(route["spec"]) == {"parentRefs", "rules"}


def test_readme_points_at_existing_manifests() -> None:
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((deploy/[^)#]+)\)", readme)) | set(
        re.findall(r"`((?:deploy)/[^`\s]+)`", readme)
    )
    assert any(p.startswith("deploy/kubernetes") for p in linked)
    for path in linked:
        assert (REPO / path).exists(), path


def test_no_kubernetes_manifest_lists_objectives_the_crd_accepts() -> None:
    """The objectives file in the no-Kubernetes ConfigMap uses the same InferenceObjective shape."""
    from tests.deploy.schemas import crd_versions, validate_custom

    crds = crd_versions(objects("crds"))
    text = one(objects("no-kubernetes"), "ConfigMap", "epp-endpoints")["data"]["objectives.yaml"]
    for obj in yaml.safe_load_all(text):
        with_pool = {**obj, "spec": {**obj["spec"], "poolRef": {"name": "any"}}}
        assert validate_custom(with_pool, crds) == []
