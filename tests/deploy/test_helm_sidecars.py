"""llm-d-router's two sidecars, rendered: the vllm-render tokenizer that token-producer asks for
tokens, and the standalone chart's Envoy, whose config the real Envoy validates (and, in
test_helm_proxy_e2e.py, runs in front of a real EPP)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy import test_wiring
from tests.deploy.envoy import ENVOY_DIR, cluster, validate
from tests.deploy.helm import EPP, args, deployment, one, options, render, render_values

Obj = dict[str, Any]
MODEL_SERVERS = {"modelServers": {"matchLabels": {"app": "vllm-qwen3-32b"}}}


def container(objs: list[Obj], name: str) -> Obj:
    containers: list[Obj] = deployment(objs)["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def config_of(objs: list[Obj]) -> Obj:
    text = test_wiring.mounted_file(deployment(objs), objs, options(objs).config_file)
    data: Obj = yaml.safe_load(text)
    return data


def envoy_config(objs: list[Obj]) -> Obj:
    """The Envoy sidecar's bootstrap, from the ConfigMap mounted where its -c points."""
    proxy = container(objs, "envoy-proxy")
    path = proxy["args"][proxy["args"].index("-c") + 1]
    volumes = {v["name"]: v for v in deployment(objs)["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in proxy["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    config_map = one(objs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    data: Obj = yaml.safe_load(config_map["data"][path.removeprefix(mount["mountPath"] + "/")])
    return data


# --- the tokenizer -------------------------------------------------------------------------------


def test_token_producer_asks_the_render_sidecar() -> None:
    objs = render("llm-d-tokenizer-values.yaml")
    render_container = container(objs, "vllm-render")
    assert render_container["command"] == ["vllm", "launch", "render"]
    assert render_container["args"] == ["Qwen/Qwen3-32B", "--port=8000"]
    ports = {p["name"]: p["containerPort"] for p in render_container["ports"]}
    producer = [p for p in config_of(objs)["plugins"] if p["type"] == "token-producer"]
    assert producer == [
        {
            "type": "token-producer",
            "parameters": {
                "modelName": "Qwen/Qwen3-32B",
                "vllm": {"url": f"http://localhost:{ports['render-http']}"},
            },
        }
    ]
    assert render_container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "render-http"}
    env = {e["name"]: e for e in render_container["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-hf-token-secret"
    # a non-root pod: the Hugging Face cache lives on the pod's volume, not under /root
    (cache,) = [m for m in render_container["volumeMounts"] if m["name"] == "model-cache"]
    assert env["HF_HOME"]["value"].startswith(cache["mountPath"])
    assert {"name": "model-cache", "emptyDir": {}} in deployment(objs)["spec"]["template"]["spec"]["volumes"]


def test_the_tokenizer_follows_its_values() -> None:
    objs = render_values(
        {
            "inferenceExtension": {
                "tokenizer": {
                    "enabled": True,
                    "modelName": "m",
                    "port": 8100,
                    "extraArgs": ["--tokenizer-mode=slow"],
                    "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
                    "image": {"registry": "", "repository": "render", "tag": 1},
                    "env": [{"name": "HF_HOME", "value": "/models"}],  # llm-d's README example
                }
            },
            "inferencePool": MODEL_SERVERS,
        }
    )
    render_container = container(objs, "vllm-render")
    assert render_container["image"] == "render:1"
    env = [(e["name"], e.get("value")) for e in render_container["env"]]
    assert env == [("HOME", "/cache"), ("HF_HOME", "/models")]  # each name once: the user's wins
    assert render_container["args"] == ["m", "--port=8100", "--tokenizer-mode=slow"]
    producer = [p for p in config_of(objs)["plugins"] if p["type"] == "token-producer"]
    assert producer[0]["parameters"]["vllm"]["url"] == "http://localhost:8100"
    assert [c["name"] for c in deployment(objs)["spec"]["template"]["spec"]["initContainers"]] == ["fetch"]


def test_no_tokenizer_by_default() -> None:
    objs = render("default-values.yaml")
    assert [c["name"] for c in deployment(objs)["spec"]["template"]["spec"]["containers"]] == ["epp"]
    assert not [p for p in config_of(objs)["plugins"] if p["type"] == "token-producer"]


# --- the Envoy sidecar ---------------------------------------------------------------------------


@pytest.mark.parametrize("secure", [True, False])
def test_envoy_validates_the_sidecars_config(secure: bool) -> None:
    objs = render_values(
        {
            "inferenceExtension": {"proxy": {"enabled": True}, "tls": {"secureServing": secure}},
            "inferencePool": MODEL_SERVERS,
        }
    )
    out = validate(envoy_config(objs))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_sidecar_reaches_the_epp_and_clients_reach_the_sidecar() -> None:
    objs = render("llm-d-standalone-proxy-values.yaml")
    opts = options(objs)
    config = envoy_config(objs)
    ext_proc = cluster(config, "ext_proc")
    (group,) = ext_proc["load_assignment"]["endpoints"]
    (endpoint,) = group["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert (address["address"], address["port_value"]) == ("127.0.0.1", opts.grpc_port)
    assert ("transport_socket" in ext_proc) == opts.secure_serving  # TLS exactly when the EPP serves it
    listeners = {
        ls["name"]: ls["address"]["socket_address"]["port_value"]
        for ls in config["static_resources"]["listeners"]
    }
    proxy = container(objs, "envoy-proxy")
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports["proxy-http"] == listeners["inference"] == 8081
    assert ports[proxy["readinessProbe"]["httpGet"]["port"]] == listeners["ready"]
    service_ports = [p for p in one(objs, "Service", EPP)["spec"]["ports"] if p["port"] == 8081]
    assert len(service_ports) == 1  # llm-d's extraServicePorts entry, not a second one


def test_a_service_port_for_the_listener_when_none_is_given() -> None:
    objs = render_values(
        {"inferenceExtension": {"proxy": {"enabled": True, "port": 8090}}, "inferencePool": MODEL_SERVERS}
    )
    by_name = {p["name"]: p for p in one(objs, "Service", EPP)["spec"]["ports"]}
    assert by_name["http-proxy"]["port"] == 8090
    ports = {p["name"]: p["containerPort"] for p in container(objs, "envoy-proxy")["ports"]}
    assert ports[by_name["http-proxy"]["targetPort"]] == 8090


def test_the_sidecars_ext_proc_is_gies() -> None:
    """The sidecar's ext_proc filter is deploy/envoy/gie.yaml's (what GIE's gateways configure)."""

    def ext_proc_filter(config: Obj) -> Obj:
        (listener,) = [ls for ls in config["static_resources"]["listeners"] if ls["name"] == "inference"]
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        (f,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
        typed: Obj = f["typed_config"]
        return typed

    ours = ext_proc_filter(envoy_config(render("llm-d-standalone-proxy-values.yaml")))
    gie = ext_proc_filter(yaml.safe_load((ENVOY_DIR / "gie.yaml").read_text()))
    for key in ("processing_mode", "failure_mode_allow", "allow_mode_override", "metadata_options"):
        assert ours[key] == gie[key], key
    fail_open = render_values(
        {"inferenceExtension": {"proxy": {"enabled": True, "failOpen": True}}, "inferencePool": MODEL_SERVERS}
    )
    assert ext_proc_filter(envoy_config(fail_open))["failure_mode_allow"] is True


def test_the_sidecars_epp_cluster_holds_as_many_requests_as_the_model_servers_one() -> None:
    """Each request holds an ext_proc stream while it runs: Envoy's default breakers (1,024 at once)
    on the EPP's cluster would fail the 1,025th concurrent request (tests/e2e/test_many_streams_envoy.py)."""
    config = envoy_config(render("llm-d-standalone-proxy-values.yaml"))
    ext_proc, servers = cluster(config, "ext_proc"), cluster(config, "original_destination_cluster")
    assert ext_proc["circuit_breakers"] == servers["circuit_breakers"]
    assert servers["circuit_breakers"]["thresholds"][0]["max_requests"] >= 40000
    # a connection's streams capped, so one Envoy thread reaches every EPP worker
    (http,) = ext_proc["typed_extension_protocol_options"].values()
    assert http["explicit_http_config"]["http2_protocol_options"]["max_concurrent_streams"] == 100


def test_a_changed_proxy_config_rolls_the_pods() -> None:
    """Envoy reads its bootstrap once: the pod template carries the ConfigMap's checksum."""

    def checksum(port: int) -> str:
        objs = render_values(
            {"inferenceExtension": {"proxy": {"enabled": True, "port": port}}, "inferencePool": MODEL_SERVERS}
        )
        value: str = deployment(objs)["spec"]["template"]["metadata"]["annotations"]["checksum/proxy"]
        return value

    assert checksum(8081) != checksum(8082)


def test_the_epp_args_do_not_change_with_the_sidecars() -> None:
    plain = render_values({"inferencePool": MODEL_SERVERS})
    both = render_values(
        {
            "inferenceExtension": {
                "proxy": {"enabled": True},
                "tokenizer": {"enabled": True, "modelName": "m"},
            },
            "inferencePool": MODEL_SERVERS,
        }
    )
    assert args(both) == args(plain)
