"""What the chart renders runs: the Deployment's args, the ConfigMap's config and the InferencePool,
given to the real ``epp`` against the test API server, route requests through a real Envoy.

The pods are simulated model servers on loopback addresses, created in the API server with the
labels the values file selects; the EPP gets the chart's args unchanged except for what a pod
gets from its spec rather than its args (ports on loopback, the kubeconfig, the config file at
a local path instead of the ConfigMap mount).
"""

from __future__ import annotations

import pathlib

import aiohttp
import pytest

from epp_kubeapi import KubeApiServer
from epp_kubeapi.objects import pod
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port
from tests.deploy import test_wiring
from tests.deploy.helm import NAMESPACE, deployment, one, options, render_values
from tests.e2e.conftest import FAST_SIM

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LABELS = {"app": "vllm-qwen3-32b"}
OWNED_BY_THE_TEST = ("--grpc-health-port=", "--config-file=")  # EppProcess picks free ports


async def test_the_charts_epp_routes_through_envoy(tmp_path: pathlib.Path) -> None:
    port = free_port()  # every simulated pod listens on it at its own 127.0.0.x, as pods share a port
    objs = render_values(
        {"inferencePool": {"modelServers": {"matchLabels": LABELS}, "targetPorts": [{"number": port}]}}
    )
    opts = options(objs)
    config = tmp_path / "plugins.yaml"
    config.write_text(test_wiring.mounted_file(deployment(objs), objs, opts.config_file))
    chart_args = [str(a) for a in test_wiring.epp_container(deployment(objs))["args"]]
    args = [a for a in chart_args if not a.startswith(OWNED_BY_THE_TEST)]
    assert len(args) == len(chart_args) - len(OWNED_BY_THE_TEST)

    api = KubeApiServer(bookmark_interval=1.0)
    api.register_inference_crds()
    ips = ["127.0.0.21", "127.0.0.22"]
    async with api:
        api.create(one(objs, "InferencePool"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
        fleets = [SimFleet(1, "--host", ip, "--base-port", str(port), *FAST_SIM) for ip in ips]
        for i, (ip, fleet) in enumerate(zip(ips, fleets, strict=True)):
            await fleet.__aenter__()
            api.create(pod(f"vllm-{i}", ip, labels=LABELS, namespace=NAMESPACE))
        try:
            epp = EppProcess(
                *args,
                f"--config-file={config}",
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                "--secure-serving=true",  # the chart leaves the EPP's default: TLS, self-signed
                env={"POD_NAME": "vllm-qwen3-32b-epp-7d4b9c6f58-x2kqv", "NAMESPACE": NAMESPACE},
            )
            async with (
                epp as e,  # waits until the health service the chart's probes ask says SERVING
                Envoy(EnvoyConfig(ext_proc_port=e.grpc_port, ext_proc_tls=True)) as proxy,
                aiohttp.ClientSession() as http,
            ):
                served: set[str] = set()
                for i in range(20):
                    body = {"model": "mock-model", "prompt": f"prompt {i}", "max_tokens": 2}
                    async with http.post(proxy.url + "/v1/completions", json=body) as r:
                        await r.read()
                        assert r.status == 200
                        served.add(r.headers.get("x-epp-destination", "").rsplit(":", 1)[0])
                assert served <= set(ips) and served, served
        finally:
            for fleet in fleets:
                await fleet.__aexit__(None, None, None)
