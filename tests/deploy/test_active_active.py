"""Active-active (issue 30), in the chart and in overlays/active-active: every replica ready and
routing, the peers found as the EPP Service's endpoints, and nothing that takes them down together.

The chart's two switches (ours, ``inferenceExtension.activeActive``, and llm-d-router's,
``replicas > 1`` with ``flags.ha-enable-leader-election: false``) and the kustomize overlay are
held to the same checks, the peer ports' shared secret and NetworkPolicy included. The peer-discovery plugin and ``--peer-port`` land with the sync branch:
the steps that need them are strict xfails naming it, to be flipped when the branches merge.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from epp.app.build import BuildOptions
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.cli.flags import Options
from epp.config.load import load_config
from epp.server import health
from epp_kubeapi import KubeApiServer
from epp_kubeapi.resources import Resource
from tests.deploy import helm, test_manifests, test_wiring
from tests.deploy.kustomize import KUBERNETES, REPO, build
from tests.deploy.schemas import KUBERNETES_VERSIONS, validate_builtin

Obj = dict[str, Any]
MODEL_SERVERS = {"modelServers": {"matchLabels": {"app": "vllm-qwen3-32b"}}}
PEER_PORT = 9004  # the EPP's --peer-port default; the warm-start snapshot is served on the next port
PEER_SECRET_FILE = "/etc/epp/peer-secret/token"
WORKERS_WITHOUT_A_LIMIT = 32  # what the chart's NetworkPolicy assumes with no CPU limit (docs/helm.md)


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


def _llm_d_with_network_policy() -> Obj:
    values: Obj = yaml.safe_load((helm.VALUES_DIR / "llm-d-active-active-values.yaml").read_text())
    values["router"]["epp"]["activeActive"] = {"networkPolicy": {"enabled": True}}
    return values


# Values given inline, by a name the parametrised tests can show.
INLINE: dict[str, Obj] = {
    "llm-d-switch+networkPolicy": _llm_d_with_network_policy(),
    "activeActive-off+secret+networkPolicy": {
        "inferenceExtension": {
            "replicas": 2,
            "activeActive": {
                "enabled": False,
                "secret": {"create": True},
                "networkPolicy": {"enabled": True},
            },
        },
        "inferencePool": MODEL_SERVERS,
    },
}


def setup(name: str) -> Setup:
    if name in INLINE:
        return Setup(helm.render_values(INLINE[name]), helm.EPP)
    if name.endswith(".yaml"):
        return Setup(helm.render(name), helm.EPP)
    return Setup(build(KUBERNETES / name), "epp")


ACTIVE_ACTIVE = ["active-active-values.yaml", "llm-d-active-active-values.yaml", "overlays/active-active"]
NOT_ACTIVE_ACTIVE = ["default-values.yaml", "ha-values.yaml", "epp", "overlays/ha"]
# A NetworkPolicy on the peer ports: the ci file turns it on, llm-d's switch with our value, the overlay always.
WITH_POLICY = ["active-active-values.yaml", "llm-d-switch+networkPolicy", "overlays/active-active"]


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
    for objs in (ours, theirs):  # each render draws its own peer token
        del test_wiring.one(objs, "Secret", f"{helm.EPP}-peer-secret")["data"]["token"]
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
    assert helm.options(objs).peer_secret_file == ""
    assert not [o for o in objs if o["kind"] in ("Secret", "NetworkPolicy")]
    assert test_manifests.FILES  # the overlay's files are in the per-file schema check too
    assert "overlays/active-active/pdb.yaml" in test_manifests.FILES


# --- the peer ports: a shared secret, a NetworkPolicy -----------------------------------------------


def peer_secret_volume(s: Setup) -> tuple[Obj, str]:
    """The secret volume --peer-secret-file is read from, and the key that file is, resolved
    through the container's mounts as the kubelet lays them out."""
    path = PurePosixPath(s.options().peer_secret_file)
    assert path.is_absolute(), path
    volumes = {v["name"]: v for v in s.deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in test_wiring.epp_container(s.deployment)["volumeMounts"]:
        if PurePosixPath(mount["mountPath"]) in path.parents:
            assert mount.get("readOnly") is True
            assert "subPath" not in mount  # the kubelet never refreshes a subPath mount: no rotation
            volume = volumes[mount["name"]]
            assert "secret" in volume, f"{path} is on volume {volume}, not a Secret"
            file = path.relative_to(mount["mountPath"]).as_posix()
            items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])}
            assert not items or file in items, f"{file} is not among the volume's items {items}"
            return volume["secret"], items.get(file, file)
    raise AssertionError(f"{path} is not inside a mounted volume")


def peer_token(objs: list[Obj]) -> str:
    secret = test_wiring.one(objs, "Secret", f"{helm.EPP}-peer-secret")
    assert secret["type"] == "Opaque"
    return base64.b64decode(secret["data"]["token"], validate=True).decode()


@pytest.mark.parametrize("name", ACTIVE_ACTIVE)
def test_peers_present_a_secret_from_a_mounted_secret(name: str) -> None:
    s = setup(name)
    assert s.options().peer_secret_file == PEER_SECRET_FILE
    volume, key = peer_secret_volume(s)
    assert key == "token"
    assert volume.get("optional", False) is False  # a pod without its Secret waits, never runs open
    if name.endswith(".yaml"):  # the chart makes the Secret it mounts
        assert volume["secretName"] == f"{helm.EPP}-peer-secret"
        assert key in test_wiring.one(s.objs, "Secret", volume["secretName"])["data"]
    else:  # kustomize cannot make a random one: the user creates it, as the header says
        assert not [o for o in s.objs if o["kind"] == "Secret"]
        assert volume["secretName"] == "epp-peer-secret"


def test_the_overlay_says_how_to_make_its_secret() -> None:
    """The header's command names the mounted Secret and key, and its token is long enough."""
    text = (KUBERNETES / "overlays/active-active/kustomization.yaml").read_text()
    found = re.search(r"kubectl create secret generic (\S+) --from-literal=(\w+)=\"\$\((.+)\)\"", text)
    assert found, "the kustomization's header lacks the kubectl command that creates the Secret"
    volume, key = peer_secret_volume(setup("overlays/active-active"))
    assert (found[1], found[2]) == (volume["secretName"], key)
    token = subprocess.run(["sh", "-c", found[3]], capture_output=True, text=True, check=True, timeout=10)
    assert len(token.stdout.strip()) >= 16  # the EPP refuses a shorter secret
    assert "do not start until it exists" in text


def test_the_generated_token_is_48_random_alphanumerics() -> None:
    token = peer_token(setup("active-active-values.yaml").objs)
    assert re.fullmatch(r"[A-Za-z0-9]{48}", token), token
    # a fresh render (no cluster to look the Secret up in) draws a new one: not a fixed default
    values = {"inferenceExtension": {"replicas": 2, "activeActive": True}, "inferencePool": MODEL_SERVERS}
    again = peer_token(helm.render_values(values))
    assert re.fullmatch(r"[A-Za-z0-9]{48}", again) and again != token


@contextlib.asynccontextmanager
async def cluster(tmp: Path) -> AsyncIterator[tuple[KubeApiServer, Path]]:
    """The test API server, serving Secrets, and a kubeconfig for helm's ``lookup``. client-go sends
    no credentials over plain HTTP, so helm is pointed at a proxy that adds the fake's token."""
    api = KubeApiServer()
    api.register(Resource("", "v1", "secrets", "Secret"))
    async with api, aiohttp.ClientSession() as http:
        config = yaml.safe_load(api.write_kubeconfig(tmp / "kubeconfig").read_text())
        auth = {"Authorization": f"Bearer {config['users'][0]['user']['token']}"}

        async def forward(request: web.Request) -> web.Response:
            url = api.url + request.path_qs
            async with http.request(request.method, url, headers=auth, data=await request.read()) as r:
                return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
            (tmp / "kubeconfig").write_text(yaml.safe_dump(config))
            yield api, tmp / "kubeconfig"
        finally:
            await runner.cleanup()


async def upgrade_render(kubeconfig: Path) -> list[Obj]:
    """What `helm upgrade` would apply: the templates rendered with ``lookup`` answered by the cluster."""
    out = await asyncio.to_thread(
        helm.run_helm,
        *("template", helm.RELEASE, str(helm.CHART), "--namespace", helm.NAMESPACE),
        *("--values", str(helm.VALUES_DIR / "active-active-values.yaml")),
        *("--dry-run=server", "--kubeconfig", str(kubeconfig)),
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


async def test_an_upgrade_keeps_the_peer_token(tmp_path: Path) -> None:
    """A new token on each upgrade would split a rollout's old and new pods; and one rotated by
    hand (two lines, mid-rotation) must survive an upgrade too."""
    async with cluster(tmp_path) as (api, kubeconfig):
        first = peer_token(await upgrade_render(kubeconfig))  # no Secret yet: a new token
        assert re.fullmatch(r"[A-Za-z0-9]{48}", first), first
        rotating = f"{first}\nthe-next-secret-0123456789"
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{helm.EPP}-peer-secret", "namespace": helm.NAMESPACE},
                "type": "Opaque",
                "data": {"token": base64.b64encode(rotating.encode()).decode()},
            }
        )
        assert peer_token(await upgrade_render(kubeconfig)) == rotating


def test_a_named_secret_is_mounted_and_none_rendered() -> None:
    values: Obj = {
        "inferenceExtension": {
            "replicas": 2,
            "activeActive": {"enabled": True, "secret": {"name": "my-peer-secret"}},
        },
        "inferencePool": MODEL_SERVERS,
    }
    s = Setup(helm.render_values(values), helm.EPP)
    assert s.options().peer_secret_file == PEER_SECRET_FILE
    volume, key = peer_secret_volume(s)
    assert (volume["secretName"], key) == ("my-peer-secret", "token")
    assert not [o for o in s.objs if o["kind"] == "Secret"]


def test_without_create_the_peer_port_stays_unauthenticated() -> None:
    values: Obj = {
        "inferenceExtension": {"replicas": 2, "activeActive": {"enabled": True, "secret": {"create": False}}},
        "inferencePool": MODEL_SERVERS,
    }
    s = Setup(helm.render_values(values), helm.EPP)
    assert s.options().peer_secret_file == ""
    assert not [o for o in s.objs if o["kind"] == "Secret"]
    assert not [v for v in s.deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert "peer" in container_ports(s)  # still active-active


@pytest.mark.parametrize("name", [*NOT_ACTIVE_ACTIVE, "activeActive-off+secret+networkPolicy"])
def test_no_peer_secret_nor_policy_without_active_active(name: str) -> None:
    s = setup(name)
    assert s.options().peer_secret_file == ""
    assert not [o for o in s.objs if o["kind"] in ("Secret", "NetworkPolicy")]


def test_the_network_policy_is_opt_in() -> None:
    ours = {"inferenceExtension": {"replicas": 2, "activeActive": True}, "inferencePool": MODEL_SERVERS}
    for objs in (helm.render("llm-d-active-active-values.yaml"), helm.render_values(ours)):
        assert not [o for o in objs if o["kind"] == "NetworkPolicy"]


def workers_per_pod(s: Setup) -> int:
    """--workers, else the EPP's default capped by the CPU limit (rounded up, epp.workers.cores)."""
    if workers := s.options().workers:
        return workers
    cpu = test_wiring.epp_container(s.deployment)["resources"].get("limits", {}).get("cpu")
    if cpu is None:
        return WORKERS_WITHOUT_A_LIMIT
    text = str(cpu)
    return math.ceil(int(text[:-1]) / 1000 if text.endswith("m") else float(text))


def policy_rules(s: Setup) -> tuple[Obj, Obj]:
    """The NetworkPolicy's rule from the EPP pods, and its rule from anywhere."""
    spec = test_wiring.one(s.objs, "NetworkPolicy")["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    (from_pods,) = [r for r in spec["ingress"] if "from" in r]
    (from_anywhere,) = [r for r in spec["ingress"] if "from" not in r]
    return from_pods, from_anywhere


# 4 workers: the ci file's and the overlay's CPU limit; llm-d's values set none, so the chart's 32
LAST_PEER_PORT = {
    "active-active-values.yaml": 9011,
    "llm-d-switch+networkPolicy": PEER_PORT + 2 * WORKERS_WITHOUT_A_LIMIT - 1,
    "overlays/active-active": 9011,
}


@pytest.mark.parametrize("name", WITH_POLICY)
def test_the_peer_ports_are_open_to_the_epp_pods_only(name: str) -> None:
    s = setup(name)
    selector = s.deployment["spec"]["selector"]["matchLabels"]
    assert test_wiring.one(s.objs, "NetworkPolicy")["spec"]["podSelector"] == {"matchLabels": selector}
    from_pods, from_anywhere = policy_rules(s)
    assert from_pods["from"] == [{"podSelector": {"matchLabels": selector}}]  # no namespaceSelector: ours
    first = s.options().peer_port
    last = first + 2 * workers_per_pod(s) - 1  # worker i: first + 2i (deltas), the next (snapshots)
    assert from_pods["ports"] == [{"protocol": "TCP", "port": first, "endPort": last}]
    assert last == LAST_PEER_PORT[name]
    ports = container_ports(s)
    assert first == ports["peer"] and ports["peer-warm"] <= last
    # from anywhere: what the container serves besides the peers, by the numbers it declares
    assert from_anywhere["ports"] == [
        {"protocol": "TCP", "port": ports[p]} for p in ("grpc", "grpc-health", "metrics")
    ]
    assert not [p for p in from_anywhere["ports"] if first <= p["port"] <= last]


@pytest.mark.parametrize("name", WITH_POLICY)
def test_the_network_policy_validates(name: str) -> None:
    policy = test_wiring.one(setup(name).objs, "NetworkPolicy")
    for version in KUBERNETES_VERSIONS:
        assert validate_builtin(policy, version) == [], version
    policy["spec"]["ingress"][0]["ports"][0]["endPort"] = "9011"  # the schema is not vacuous here
    assert validate_builtin(policy, KUBERNETES_VERSIONS[-1]) != []


def _cpu(limit: str | float) -> Obj:
    return {"resources": {"requests": {"cpu": 1}, "limits": {"cpu": limit}}}


@pytest.mark.parametrize(
    ("given", "peer_port", "first", "last"),
    [
        ({"flags": {"workers": 3}}, PEER_PORT, PEER_PORT, PEER_PORT + 5),
        (_cpu("1500m"), PEER_PORT, PEER_PORT, PEER_PORT + 3),  # 2 workers: the EPP rounds a quota up
        (_cpu(2.5), PEER_PORT, PEER_PORT, PEER_PORT + 5),
        (_cpu(1), 9100, 9100, 9101),
        (
            {},
            PEER_PORT,
            PEER_PORT,
            PEER_PORT + 2 * WORKERS_WITHOUT_A_LIMIT - 1,
        ),  # the chart's default: no limit
    ],
)
def test_the_peer_range_follows_the_workers(given: Obj, peer_port: int, first: int, last: int) -> None:
    active = {"enabled": True, "peerPort": peer_port, "networkPolicy": {"enabled": True}}
    epp = {"replicas": 2, "activeActive": active, **given}
    s = Setup(helm.render_values({"inferenceExtension": epp, "inferencePool": MODEL_SERVERS}), helm.EPP)
    from_pods, _ = policy_rules(s)
    assert from_pods["ports"] == [{"protocol": "TCP", "port": first, "endPort": last}]
    assert last == first + 2 * workers_per_pod(s) - 1
    assert s.options().peer_port == first


def test_sidecar_and_extra_ports_stay_open() -> None:
    """The Envoy sidecar's ports and extraIngressPorts (Istio's) are opened to all; nothing else."""
    policy = {"enabled": True, "extraIngressPorts": [15090, 15020]}
    values: Obj = {
        "inferenceExtension": {
            "replicas": 2,
            "activeActive": {"enabled": True, "networkPolicy": policy},
            "proxy": {"enabled": True},
        },
        "inferencePool": MODEL_SERVERS,
    }
    s = Setup(helm.render_values(values), helm.EPP)
    pod = s.deployment["spec"]["template"]["spec"]
    (envoy,) = [c for c in pod["containers"] if c["name"] == "envoy-proxy"]
    declared = {
        p["containerPort"] for c in (test_wiring.epp_container(s.deployment), envoy) for p in c["ports"]
    }
    _, from_anywhere = policy_rules(s)
    opened = [p["port"] for p in from_anywhere["ports"]]
    peer = {container_ports(s)["peer"], container_ports(s)["peer-warm"]}
    assert sorted(opened) == sorted((declared - peer) | {15090, 15020})
