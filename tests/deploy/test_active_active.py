"""Active-active (issue 30), in the chart and in overlays/active-active: every replica ready and
routing, the peers found as the EPP Service's endpoints, and nothing that takes them down together.

The chart's two switches (ours, ``inferenceExtension.activeActive``, and llm-d-router's,
``replicas > 1`` with ``flags.ha-enable-leader-election: false``) and the kustomize overlay are
held to the same checks. The peer-discovery plugin and ``--peer-port`` land with the sync branch:
the steps that need them are strict xfails naming it, to be flipped when the branches merge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from epp.app.build import BuildOptions
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.cli.flags import Options
from epp.config.load import load_config
from epp.server import health
from tests.deploy import helm, test_manifests, test_wiring
from tests.deploy.kustomize import KUBERNETES, REPO, build
from tests.deploy.schemas import KUBERNETES_VERSIONS, validate_builtin

Obj = dict[str, Any]
MODEL_SERVERS = {"modelServers": {"matchLabels": {"app": "vllm-qwen3-32b"}}}
PEER_PORT = 9004  # the EPP's --peer-port default; the warm-start snapshot is served on the next port


@dataclass(frozen=True, slots=True)
class Setup:
    objs: list[Obj]
    epp: str  # the Deployment's, Service's and ServiceAccount's name

    @property
    def deployment(self) -> Obj:
        return test_wiring.one(self.objs, "Deployment", self.epp)

    @property
    def service(self) -> Obj:
        return test_wiring.one(self.objs, "Service", self.epp)

    @property
    def pod_labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.deployment["spec"]["template"]["metadata"]["labels"]
        return labels

    def options(self) -> Options:
        return test_wiring.parsed_options(self.deployment)

    def config_text(self) -> str:
        path = test_wiring.parsed_options(self.deployment).config_file
        return test_wiring.mounted_file(self.deployment, self.objs, path)


def setup(name: str) -> Setup:
    if name.endswith(".yaml"):
        return Setup(helm.render(name), helm.EPP)
    return Setup(build(KUBERNETES / name), "epp")


ACTIVE_ACTIVE = ["active-active-values.yaml", "llm-d-active-active-values.yaml", "overlays/active-active"]
NOT_ACTIVE_ACTIVE = ["default-values.yaml", "ha-values.yaml", "epp", "overlays/ha"]


def container_ports(s: Setup) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in test_wiring.epp_container(s.deployment)["ports"]}


# --- every replica serves ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_every_replica_reports_ready(name: str) -> None:
    s = setup(name)
    opts = s.options()
    assert s.deployment["spec"]["replicas"] > 1
    assert opts.ha_enable_leader_election is False
    assert not [o for o in s.objs if o["kind"] == "Role" and "leader-election" in o["metadata"]["name"]]
    ready = test_wiring.epp_container(s.deployment)["readinessProbe"]["grpc"]
    assert ready["port"] == opts.grpc_health_port
    # what the EPP's health servicer answers a ready replica that does not lead (none does)
    servicer = health.HealthServicer(lambda: True, leader_election=False, leader=lambda: False)
    assert servicer.status(ready["service"]) == health.SERVING


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_rollouts_and_drains_keep_replicas_serving(name: str) -> None:
    s = setup(name)
    assert s.deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    budget = test_wiring.one(s.objs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= s.pod_labels.items()


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_replicas_prefer_separate_nodes(name: str) -> None:
    s = setup(name)
    anti = s.deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= s.pod_labels.items()
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti  # a small cluster still schedules


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_each_pod_runs_as_many_workers_as_its_cpu_limit_allows(name: str) -> None:
    """--workers is left to the EPP (its default: the cores the pod may use), so the CPU limit sets it."""
    s = setup(name)
    assert not any(a.startswith("--workers") for a in test_wiring.epp_container(s.deployment)["args"])
    if name != "llm-d-active-active-values.yaml":  # llm-d's values leave the limit unset, as its chart
        resources = test_wiring.epp_container(s.deployment)["resources"]
        assert resources["limits"]["cpu"] == resources["requests"]["cpu"]


# --- the peers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_the_peers_are_the_services_endpoints(name: str) -> None:
    """k8s-peer-discovery watches the EndpointSlices of a Service that selects exactly the EPP
    pods, reading the port by the name the Service gives it, which reaches the container's peer port."""
    s = setup(name)
    config = yaml.safe_load(s.config_text())
    (discovery,) = [p for p in config["plugins"] if p["type"] == "k8s-peer-discovery"]
    assert config["dataLayer"]["peerDiscovery"] == {"pluginRef": discovery.get("name", discovery["type"])}
    params = discovery["parameters"]
    assert params["service"] == s.service["metadata"]["name"]
    assert s.service["spec"]["selector"].items() <= s.pod_labels.items()
    by_name = {p["name"]: p for p in s.service["spec"]["ports"]}
    peer = by_name[params["portName"]]
    ports = container_ports(s)
    assert ports[peer["targetPort"]] == peer["port"] == PEER_PORT
    assert ports["peer-warm"] == PEER_PORT + 1


@pytest.mark.parametrize("name", NOT_ACTIVE_ACTIVE)
def test_no_peers_without_active_active(name: str) -> None:
    s = setup(name)
    assert "peer" not in container_ports(s)
    assert "peer" not in {p["name"] for p in s.service["spec"]["ports"]}
    assert "peerDiscovery" not in yaml.safe_load(s.config_text()).get("dataLayer", {})
    rules = [r for o in s.objs if o["kind"] == "Role" for r in o["rules"]]
    assert not [r for r in rules if "endpointslices" in r.get("resources", [])]
    assert s.deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("name", sorted(ACTIVE_ACTIVE))
def test_the_active_active_config_builds(name: str) -> None:
    """The config the EPP would load, with its peer discovery, builds as at the EPP's start."""
    s = setup(name)
    env = helm.container_env(test_wiring.epp_container(s.deployment))
    opts = s.options()
    components = build_components(
        load_config(s.config_text()),
        default_registry(),
        BuildOptions(metrics=opts.model_server_metrics, env=env),
    )
    assert components.scheduler.profiles


def test_the_overlay_validates() -> None:
    """overlays/active-active's patched objects, not only its files, pass Kubernetes' schemas."""
    for obj in build(KUBERNETES / "overlays/active-active"):
        for version in KUBERNETES_VERSIONS:
            errors = validate_builtin(obj, version)
            assert errors == [], f"{obj['kind']}/{obj['metadata']['name']} on {version}: {errors}"


def test_the_overlay_config_is_the_default_plus_the_peers() -> None:
    """Only the peer discovery differs from config/default.yaml (and so from the base ConfigMap)."""
    config = yaml.safe_load(setup("overlays/active-active").config_text())
    config["plugins"] = [p for p in config["plugins"] if p["type"] != "k8s-peer-discovery"]
    del config["dataLayer"]["peerDiscovery"]
    assert config == yaml.safe_load((REPO / "config" / "default.yaml").read_text())


# --- the chart's values --------------------------------------------------------------------------


def test_llm_d_switch_renders_ours() -> None:
    """llm-d-router's switch gives what `activeActive: true` gives, but for the flag it spells out."""
    ours = helm.render_values(
        {
            "inferenceExtension": {"replicas": 2, "activeActive": True},
            "inferencePool": MODEL_SERVERS,
        }
    )
    theirs = helm.render("llm-d-active-active-values.yaml")
    flag = "--ha-enable-leader-election=false"
    assert flag in helm.args(theirs) and flag not in helm.args(ours)
    test_wiring.epp_container(helm.deployment(theirs))["args"].remove(flag)
    del helm.deployment(theirs)["spec"]["template"]["metadata"]["annotations"]
    del helm.deployment(ours)["spec"]["template"]["metadata"]["annotations"]  # the config's checksum
    assert json.dumps(theirs, sort_keys=True) == json.dumps(ours, sort_keys=True)


def test_a_given_affinity_and_budget_win() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}]}}}  # fmt: skip
    objs = helm.render_values(
        {
            "inferenceExtension": {
                "replicas": 3,
                "activeActive": {"enabled": True},
                "affinity": affinity,
                "podDisruptionBudget": {"enabled": False},
            },
            "inferencePool": MODEL_SERVERS,
        }
    )
    assert helm.deployment(objs)["spec"]["template"]["spec"]["affinity"] == affinity
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    objs = helm.render_values(
        {
            "inferenceExtension": {
                "replicas": 3,
                "activeActive": True,
                "podDisruptionBudget": {"minAvailable": 2},
            },
            "inferencePool": MODEL_SERVERS,
        }
    )
    assert test_wiring.one(objs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": {"inferencepool": helm.EPP}},
    }


def _moved_peer_port() -> list[Obj]:
    return helm.render_values(
        {
            "inferenceExtension": {"replicas": 2, "activeActive": {"enabled": True, "peerPort": 9100}},
            "inferencePool": MODEL_SERVERS,
        }
    )


def test_a_moved_peer_port_moves_every_reference() -> None:
    objs = _moved_peer_port()
    assert "--peer-port=9100" in helm.args(objs)
    s = Setup(objs, helm.EPP)
    assert (container_ports(s)["peer"], container_ports(s)["peer-warm"]) == (9100, 9101)
    assert {p["name"]: p["port"] for p in s.service["spec"]["ports"]}["peer"] == 9100


def test_a_moved_peer_port_reaches_the_epp() -> None:
    assert helm.options(_moved_peer_port()).peer_port == 9100


def test_active_active_with_leader_election_is_refused() -> None:
    message = helm.render_error(
        {
            "inferenceExtension": {
                "replicas": 2,
                "activeActive": True,
                "flags": {"ha-enable-leader-election": True},
            },
            "inferencePool": MODEL_SERVERS,
        }
    )
    assert ".Values.inferenceExtension.activeActive" in message and "ha-enable-leader-election" in message


def test_istio_ejects_a_failing_replica() -> None:
    values: Obj = {
        "inferenceExtension": {"replicas": 2, "activeActive": True},
        "inferencePool": MODEL_SERVERS,
        "provider": {"name": "istio"},
    }
    policy = test_wiring.one(helm.render_values(values), "DestinationRule")["spec"]["trafficPolicy"]
    assert policy["outlierDetection"]["consecutiveGatewayErrors"] == 1
    assert policy["outlierDetection"]["interval"] == "1s"
    mine = {"consecutive5xxErrors": 5, "interval": "10s"}
    values["provider"]["istio"] = {"destinationRule": {"trafficPolicy": {"outlierDetection": mine}}}
    policy = test_wiring.one(helm.render_values(values), "DestinationRule")["spec"]["trafficPolicy"]
    assert policy["outlierDetection"] == mine
    hot_standby = helm.render_values({"inferencePool": MODEL_SERVERS, "provider": {"name": "istio"}})
    assert "outlierDetection" not in test_wiring.one(hot_standby, "DestinationRule")["spec"]["trafficPolicy"]


def test_gke_checks_each_replica_every_second() -> None:
    objs = helm.render_values(
        {
            "inferenceExtension": {"replicas": 2, "activeActive": True},
            "inferencePool": MODEL_SERVERS,
            "provider": {"name": "gke"},
        }
    )
    (check,) = [
        o for o in objs if o["kind"] == "HealthCheckPolicy" and o["spec"]["targetRef"]["kind"] == "Service"
    ]
    assert check["spec"]["targetRef"] == {"group": "", "kind": "Service", "name": helm.EPP}
    assert check["spec"]["default"]["checkIntervalSec"] == 1
    assert check["spec"]["default"]["unhealthyThreshold"] == 1
    assert check["spec"]["default"]["config"] == {
        "type": "GRPC",
        "grpcHealthCheck": {
            "portSpecification": "USE_FIXED_PORT",
            "port": helm.options(objs).grpc_health_port,
        },
    }


def test_the_default_values_stay_hot_standby_capable() -> None:
    """Turning replicas up without a switch is still GIE's leader election, not active-active."""
    objs = helm.render_values({"inferenceExtension": {"replicas": 2}, "inferencePool": MODEL_SERVERS})
    assert helm.options(objs).ha_enable_leader_election is True
    assert "peer" not in container_ports(Setup(objs, helm.EPP))
    assert test_manifests.FILES  # the overlay's files are in the per-file schema check too
    assert "overlays/active-active/pdb.yaml" in test_manifests.FILES
