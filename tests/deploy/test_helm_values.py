"""What each value does: GIE's values give the expected EPP args and objects, llm-d-router's
values give exactly what their GIE equivalents give, and bad values fail the render naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from epp.app.build import BuildOptions
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.errors import ConfigError
from epp.parsers.registry import ParserRegistry
from tests.deploy import test_wiring
from tests.deploy.helm import (
    EPP,
    NAMESPACE,
    RELEASE,
    VALUES_DIR,
    args,
    container_env,
    deployment,
    one,
    options,
    render,
    render_error,
    render_values,
)
from tests.deploy.schemas import KUBERNETES_VERSIONS, validate_builtin

Obj = dict[str, Any]
MODEL_SERVERS = {"modelServers": {"matchLabels": {"app": "vllm-qwen3-32b"}}}
MODEL_SERVERS_LLM_D: Obj = {"modelServers": {"matchLabels": {"app": "my-vllm"}}}


def config_of(objs: list[Obj]) -> Obj:
    """The EndpointPickerConfig the EPP loads, as YAML data."""
    text = test_wiring.mounted_file(deployment(objs), objs, options(objs).config_file)
    data: Obj = yaml.safe_load(text)
    return data


def plugin(config: Obj, type_: str) -> Obj:
    found: list[Obj] = [p for p in config["plugins"] if p["type"] == type_]
    assert len(found) == 1, f"{len(found)} plugins of type {type_}"
    return found[0]


# --- GIE's values -------------------------------------------------------------------------------


def test_default_values_give_gies_args() -> None:
    assert args(render("default-values.yaml")) == [
        f"--pool-name={RELEASE}",
        f"--pool-namespace={NAMESPACE}",
        "--pool-group=inference.networking.k8s.io",
        "--config-file=/config/default-plugins.yaml",
        "--grpc-health-port=9003",
        "--tracing=false",
        "--zap-encoder=json",
    ]


def test_gies_full_values() -> None:
    objs = render("gie-full-values.yaml")
    opts = options(objs)
    assert (opts.v, opts.max_request_body_bytes, opts.refresh_metrics_interval) == (3, 134217728, 0.1)
    assert opts.emit_endpoint_scores is True
    assert "--max-request-body-bytes=134217728" in args(objs)  # not 1.34217728e+08
    pod = deployment(objs)["spec"]["template"]["spec"]
    container = test_wiring.epp_container(deployment(objs))
    assert container["image"] == "registry.example.com/inference/epp:v0.1.0"
    assert container["imagePullPolicy"] == "Always"
    assert container_env(container)["PYTHONHASHSEED"] == "0"
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert {"name": "debug", "containerPort": 9191} in container["ports"]
    assert 9191 in {p["port"] for p in one(objs, "Service", EPP)["spec"]["ports"]}
    source = plugin(config_of(objs), "metrics-data-source")
    assert source["parameters"] == {"scheme": "https", "path": "/metrics", "insecureSkipVerify": False}
    pool = one(objs, "InferencePool")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [8000, 8001]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    priorities = {
        o["metadata"]["name"]: o["spec"]["priority"] for o in objs if o["kind"] == "InferenceObjective"
    }
    assert priorities == {"interactive": 10, "batch": -1}
    route = one(objs, "HTTPRoute")
    assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    ]
    assert rule["matches"][0]["headers"] == [
        {"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "Qwen/Qwen3-32B"}
    ]
    assert rule["timeouts"] == {"request": "120s"}


def test_env_may_be_a_map_as_in_gies_comments() -> None:
    objs = render_values(
        {"inferenceExtension": {"env": {"FEATURE": True, "WORKERS": 3}}, "inferencePool": MODEL_SERVERS}
    )
    env = container_env(test_wiring.epp_container(deployment(objs)))
    assert (env["FEATURE"], env["WORKERS"]) == ("true", "3")


def test_gies_sidecar_runs_beside_the_epp() -> None:
    sidecar = {
        "enabled": True,
        "name": "log-shipper",
        "image": "registry.example.com/shipper:1",
        "args": ["--to", "collector:4317"],
        "ports": [{"name": "shipper", "containerPort": 7070}],
        "volumes": [{"name": "shipper-config", "configMap": {"name": "{{ .Release.Name }}-shipper"}}],
        "volumeMounts": [{"name": "shipper-config", "mountPath": "/etc/shipper"}],
        "configMap": {"name": f"{RELEASE}-shipper", "data": {"shipper.yaml": "level: info"}},
    }
    objs = render_values({"inferenceExtension": {"sidecar": sidecar}, "inferencePool": MODEL_SERVERS})
    pod = deployment(objs)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "log-shipper"]
    assert container["args"] == ["--to", "collector:4317"]
    assert container["volumeMounts"] == [{"name": "shipper-config", "mountPath": "/etc/shipper"}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shipper-config"]["configMap"]["name"] == f"{RELEASE}-shipper"  # templated, as GIE's
    assert one(objs, "ConfigMap", f"{RELEASE}-shipper")["data"] == {"shipper.yaml": "level: info"}
    assert options(objs).mode == "pool"  # the EPP container is still the one named epp
    for obj in objs:
        if obj["kind"] in ("Deployment", "ConfigMap"):
            assert validate_builtin(obj, KUBERNETES_VERSIONS[-1]) == [], obj["kind"]


def test_ha_is_hot_standby_with_leader_election() -> None:
    objs = render("ha-values.yaml")
    assert deployment(objs)["spec"]["replicas"] == 3
    assert options(objs).ha_enable_leader_election is True
    assert "--ha-enable-leader-election=true" in args(objs)
    budget = one(objs, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 2
    labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not [o for o in render("default-values.yaml") if o["kind"] == "PodDisruptionBudget"]


def test_active_active_keeps_every_replica_ready() -> None:
    objs = render("active-active-values.yaml")
    assert deployment(objs)["spec"]["replicas"] == 3
    assert options(objs).ha_enable_leader_election is False
    container = test_wiring.epp_container(deployment(objs))
    assert container["readinessProbe"]["grpc"]["service"] == test_wiring.GIE_PROBE_SERVICE


def test_inline_config_is_the_one_loaded() -> None:
    objs = render("custom-config-values.yaml")
    assert options(objs).config_file == "/config/custom-plugins.yaml"
    config = config_of(objs)
    assert plugin(config, "approx-prefix-cache-producer")["parameters"]["blockSizeTokens"] == 64
    assert "default-plugins.yaml" in one(objs, "ConfigMap", EPP)["data"]  # still there to switch back to


def test_tls_mounts_the_certificate_secret() -> None:
    objs = render("tls-values.yaml")
    opts = options(objs)
    assert (opts.secure_serving, opts.cert_path, opts.enable_cert_reload) == (True, "/etc/epp/tls", True)
    pod = deployment(objs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = {m["mountPath"]: m for m in test_wiring.epp_container(deployment(objs))["volumeMounts"]}[
        opts.cert_path
    ]
    assert volumes[mount["name"]]["secret"] == {"secretName": "epp-ext-proc-tls"}
    assert mount["readOnly"] is True


def test_tracing_sets_otel_env() -> None:
    objs = render("tracing-values.yaml")
    assert options(objs).tracing is True
    env = container_env(test_wiring.epp_container(deployment(objs)))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring.svc.cluster.local:4317"
    assert (env["OTEL_TRACES_EXPORTER"], env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == (
        "otlp",
        "parentbased_traceidratio",
        "0.1",
    )
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == (
        f"k8s.namespace.name={NAMESPACE},k8s.node.name=node-1,k8s.pod.name={env['POD_NAME']}"
    )
    default_env = container_env(test_wiring.epp_container(deployment(render("default-values.yaml"))))
    assert not [k for k in default_env if k.startswith("OTEL_")]


def test_prometheus_service_monitor_scrapes_the_epp_service() -> None:
    objs = render("prometheus-values.yaml")
    monitor = one(objs, "ServiceMonitor")
    service = one(objs, "Service", EPP)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["interval"] == "15s"
    secret = one(objs, "Secret", endpoint["authorization"]["credentials"]["name"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == EPP


def test_metrics_without_auth() -> None:
    objs = render("no-metrics-auth-values.yaml")
    assert "authorization" not in one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert not [o for o in objs if o["kind"] == "Secret"]
    annotations = deployment(objs)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


def test_istio_destination_rule_matches_the_serving_mode() -> None:
    objs = render("istio-values.yaml")
    assert options(objs).secure_serving is False
    rule = one(objs, "DestinationRule")
    assert rule["spec"]["host"] == f"{EPP}.{NAMESPACE}.svc.cluster.local"
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "DISABLE"}
    assert rule["spec"]["trafficPolicy"]["connectionPool"] == {"http": {"maxRequestsPerConnection": 256000}}
    secure = render_values({"provider": {"name": "istio"}, "inferencePool": MODEL_SERVERS})
    assert one(secure, "DestinationRule")["spec"]["trafficPolicy"]["tls"] == {
        "mode": "SIMPLE",
        "insecureSkipVerify": True,
    }


def test_gke_policies_and_managed_prometheus() -> None:
    objs = render("gke-values.yaml")
    for kind in ("HealthCheckPolicy", "GCPBackendPolicy"):
        target = one(objs, kind)["spec"]["targetRef"]
        assert target == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    check = one(objs, "HealthCheckPolicy")["spec"]["default"]["config"]
    assert check == {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health", "port": 8000}}
    monitoring = one(objs, "PodMonitoring")
    labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert monitoring["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitoring["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in test_wiring.epp_container(deployment(objs))["ports"]}
    secret = one(objs, "Secret", endpoint["authorization"]["credentials"]["secret"]["name"])
    assert (
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        == f"{RELEASE}-metrics-reader-sa"
    )
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]


def test_sglang_reads_sglangs_metrics() -> None:
    objs = render("sglang-values.yaml")
    assert plugin(config_of(objs), "core-metrics-extractor")["parameters"] == {"defaultEngine": "sglang"}
    assert not [
        a for a in args(objs) if a.endswith("-metric")
    ]  # GIE's chart passes the old flags; the EPP refuses them
    assert one(objs, "InferencePool")["spec"]["targetPorts"] == [{"number": 30000}]


def test_vllm_grpc_uses_h2c_and_the_grpc_parser() -> None:
    objs = render("vllm-grpc-values.yaml")
    assert one(objs, "InferencePool")["spec"]["appProtocol"] == "kubernetes.io/h2c"
    config = config_of(objs)
    assert config["parser"] == {"pluginRef": "vllmgrpc-parser"}
    assert load_config(yaml.safe_dump(config)).parser is not None


def test_latency_predictor_switches_the_profile_not_the_pod() -> None:
    objs = render("latency-predictor-values.yaml")
    (profile,) = config_of(objs)["schedulingProfiles"]
    refs = [p["pluginRef"] for p in profile["plugins"]]
    assert refs[0] == "predicted-latency-producer" and "latency-scorer" in refs
    assert [c["name"] for c in deployment(objs)["spec"]["template"]["spec"]["containers"]] == ["epp"]


def test_standalone_selects_pods_by_label() -> None:
    objs = render("standalone-values.yaml")
    opts = options(objs)
    assert opts.endpoint_selector_labels == (("app", "vllm-qwen3-32b"), ("tier", "serving"))
    assert opts.endpoint_target_ports == (8000, 8001)
    assert opts.deployment_name == EPP  # the pool is named after the EPP's Deployment, from POD_NAME
    assert not [o for o in objs if o["kind"].startswith("Inference")]


# --- llm-d-router's values map onto GIE's --------------------------------------------------------

LLM_D_AS_GIE: Obj = {
    "inferenceExtension": {
        "replicas": 2,
        "image": {"registry": "registry.example.com", "repository": "inference/epp", "tag": "v0.1.0"},
        "grpcHealthPort": 9005,
        "flags": {"v": 3, "tracing": True},
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "pluginsConfigFile": "custom-plugins.yaml",
        "resources": {"requests": {"cpu": "8", "memory": "16Gi"}, "limits": {"memory": "32Gi"}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "failureMode": "FailClose",
        "monitoring": {"prometheus": {"enabled": True, "auth": {"enabled": True}}},
        "tracing": {
            "enabled": True,
            "otelExporterEndpoint": "http://otel-collector.monitoring.svc.cluster.local:4317",
            "sampling": {"samplerArg": "0.25"},
        },
    },
    "inferencePool": {
        "parser": "openai-parser",
        "modelServerType": "vllm",
        "modelServerProtocol": "http",
        "targetPorts": [{"number": 8200}],
        "modelServers": {"matchLabels": {"app": "my-vllm"}},
    },
    "inferenceObjectives": [{"name": "high-priority", "priority": 100}],
    "provider": {"name": "istio"},
    "experimentalHttpRoute": {
        "enabled": True,
        "inferenceGatewayName": "my-company-gateway",
        "inferenceGatewayNamespace": "gateway-infra",
        "requestTimeout": "120s",
    },
}


def test_llm_d_values_render_as_their_gie_equivalent() -> None:
    custom = yaml.safe_load((VALUES_DIR / "llm-d-values.yaml").read_text())["router"]["epp"][
        "pluginsCustomConfig"
    ]
    gie = {
        **LLM_D_AS_GIE,
        "inferenceExtension": {**LLM_D_AS_GIE["inferenceExtension"], "pluginsCustomConfig": custom},
    }
    assert render_values(gie) == render("llm-d-values.yaml")


def test_llm_d_values_give_the_expected_args() -> None:
    objs = render("llm-d-values.yaml")
    opts = options(objs)
    assert (opts.grpc_health_port, opts.v, opts.tracing, opts.ha_enable_leader_election) == (
        9005,
        3,
        True,
        True,
    )
    assert opts.config_file == "/config/custom-plugins.yaml"
    assert container_env(test_wiring.epp_container(deployment(objs)))["POD_IP"] == "10.0.0.7"
    assert one(objs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    assert one(objs, "HTTPRoute")["spec"]["parentRefs"][0]["namespace"] == "gateway-infra"


def test_llm_d_standalone_is_gies_standalone() -> None:
    gie = {
        "inferenceExtension": {
            "endpointsServer": {
                "createInferencePool": False,
                "endpointSelector": "app=my-model-service",
                "targetPorts": "8000,8001",
            }
        }
    }
    assert render_values(gie) == render("llm-d-standalone-values.yaml")


def test_llm_d_parsers_name_the_parser() -> None:
    objs = render_values({"router": {"epp": {"parsers": ["passthrough-parser"]}, **MODEL_SERVERS_LLM_D}})
    assert config_of(objs)["parser"] == {"pluginRef": "passthrough-parser"}


def test_llm_d_parsers_several_are_resolved_per_request() -> None:
    """llm-d's chart default form: two parsers become requestHandler.parsers, and the EPP builds it."""
    objs = render_values(
        {"router": {"epp": {"parsers": ["openai-parser", "anthropic-parser"]}, **MODEL_SERVERS_LLM_D}}
    )
    config = config_of(objs)
    assert "parser" not in config
    assert config["requestHandler"] == {
        "parsers": [{"pluginRef": "openai-parser"}, {"pluginRef": "anthropic-parser"}]
    }
    assert {"openai-parser", "anthropic-parser"} <= {p["type"] for p in config["plugins"]}
    built = build_components(load_config(yaml.safe_dump(config)), default_registry(), BuildOptions())
    assert isinstance(built.parser, ParserRegistry)


# --- bad values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, ".Values.inferencePool.modelServers.matchLabels is required"),
        (
            {"router": {"modelServers": {"type": "vllm"}}},
            ".Values.router.modelServers.matchLabels is required",
        ),
        (
            {"provider": {"name": "aws"}, "inferencePool": MODEL_SERVERS},
            ".Values.provider.name must be one of",
        ),
        (
            {"router": {"proxy": {"enabled": True, "proxyType": "agentgateway"}, **MODEL_SERVERS_LLM_D}},
            ".Values.router.proxy.proxyType: only envoy is rendered",
        ),
        (
            {"router": {"proxy": {"enabled": True, "mode": "service"}, **MODEL_SERVERS_LLM_D}},
            ".Values.router.proxy.mode: only sidecar is rendered",
        ),
        (
            {
                "inferenceExtension": {"proxy": {"enabled": True, "port": "http"}},
                "inferencePool": MODEL_SERVERS,
            },
            ".Values.inferenceExtension.proxy.port must be a port number",
        ),
        (
            {"router": {"tokenizer": {"enabled": True}, **MODEL_SERVERS_LLM_D}},
            ".Values.router.tokenizer.modelName is required",
        ),
        (
            {"provider": {"gke": {"preferredBackends": {"enabled": True}}}, "inferencePool": MODEL_SERVERS},
            ".Values.provider.gke.preferredBackends: GKE's preferred and backup backends need provider.name gke",
        ),
        (
            {
                "provider": {
                    "name": "gke",
                    "gke": {"preferredBackends": {"enabled": True, "defaultReplicas": -1}},
                },
                "inferencePool": MODEL_SERVERS,
            },
            ".Values.provider.gke.preferredBackends.defaultReplicas must be at least 1",
        ),
        (
            {
                "provider": {"name": "gke", "gke": {"preferredBackends": {"enabled": True}}},
                "inferenceExtension": {"activeActive": True},
                "inferencePool": MODEL_SERVERS,
            },
            "cannot be combined with activeActive",
        ),
        (
            {"inferenceExtension": {"flags": {"pool-name": "x"}}, "inferencePool": MODEL_SERVERS},
            "flags.pool-name",
        ),
        ({"inferenceExtension": {"flags": {"--v": 3}}, "inferencePool": MODEL_SERVERS}, "without dashes"),
        (
            {"inferenceExtension": {"pluginsConfigFile": "mine.yaml"}, "inferencePool": MODEL_SERVERS},
            '.Values.inferenceExtension.pluginsConfigFile "mine.yaml"',
        ),
        (
            {
                "inferenceExtension": {"pluginsCustomConfig": {"default-plugins.yaml": "x"}},
                "inferencePool": MODEL_SERVERS,
            },
            "default-plugins.yaml is the chart's own",
        ),
        (
            {"inferenceExtension": {"failureMode": "Open"}, "inferencePool": MODEL_SERVERS},
            "failureMode must be",
        ),
        (
            {"inferenceExtension": {"replicas": 0}, "inferencePool": MODEL_SERVERS},
            "replicas must be at least 1",
        ),
        (
            {"inferenceExtension": {"resources": None}, "inferencePool": MODEL_SERVERS},
            "resources.requests is required",
        ),
        (
            {
                "inferenceExtension": {"tls": {"certSecretName": "s", "secureServing": False}},
                "inferencePool": MODEL_SERVERS,
            },
            "certSecretName is set but secure serving is off",
        ),
        (
            {"inferencePool": {**MODEL_SERVERS, "apiVersion": "inference.networking.x-k8s.io/v1alpha2"}},
            ".Values.inferencePool.apiVersion",
        ),
        ({"inferencePool": {**MODEL_SERVERS, "targetPorts": [8000]}}, ".Values.inferencePool.targetPorts[0]"),
        ({"inferencePool": {**MODEL_SERVERS, "modelServerProtocol": "h2"}}, "modelServerProtocol must be"),
        (
            {"router": {"inferencePool": {"create": False}}},
            "standalone mode (no InferencePool) needs a label selector",
        ),
        (
            {
                "inferenceExtension": {
                    "endpointsServer": {
                        "createInferencePool": False,
                        "endpointSelector": "app=x",
                        "targetPorts": "http",
                    }
                }
            },
            "standalone mode needs target ports as numbers",
        ),
        (
            {
                "router": {
                    "inferencePool": {"create": False},
                    "inferenceObjectives": [{"name": "a", "priority": 1}],
                    **MODEL_SERVERS_LLM_D,
                }
            },
            "inferenceObjectives can only be set",
        ),
    ],
)
def test_bad_values_fail_naming_the_field(values: Obj, message: str) -> None:
    assert message in render_error(values)


def test_a_flag_the_epp_rejects_is_caught_by_the_validation() -> None:
    """helm passes any flag through; the flag parser check is what stops it before a cluster does."""
    objs = render_values(
        {"inferenceExtension": {"flags": {"no-such-flag": 1}}, "inferencePool": MODEL_SERVERS}
    )
    with pytest.raises(ConfigError, match="no-such-flag"):
        options(objs)
    objs = render_values({"inferenceExtension": {"flags": {"v": "loud"}}, "inferencePool": MODEL_SERVERS})
    with pytest.raises(ConfigError, match="loud"):
        options(objs)
