"""The chart's Envoy sidecar config, run by the real Envoy in front of a real EPP over its default
TLS, routes requests to the simulated model servers. Only the addresses move (loopback, free ports):
in the pod, Envoy and the EPP share localhost."""

from __future__ import annotations

import aiohttp
import pytest

from epp_sim.demo.procs import EppProcess, SimFleet
from tests.deploy.envoy import cluster, run
from tests.deploy.helm import render_values
from tests.deploy.test_helm_sidecars import envoy_config
from tests.e2e.conftest import FAST_SIM

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def test_the_sidecar_config_routes_through_the_epp() -> None:
    objs = render_values(
        {
            "inferenceExtension": {"proxy": {"enabled": True}},
            "inferencePool": {"modelServers": {"matchLabels": {"app": "x"}}},
        }
    )
    config = envoy_config(objs)
    assert "transport_socket" in cluster(config, "ext_proc")  # the chart's default: the EPP serves TLS
    config["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in config["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": 0}
    async with SimFleet(2, *FAST_SIM) as fleet:
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1", "--secure-serving=true"
        )
        async with epp:
            (group,) = cluster(config, "ext_proc")["load_assignment"]["endpoints"]
            group["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"] = epp.grpc_port
            async with run(config) as envoy, aiohttp.ClientSession() as http:
                served = set()
                for i in range(12):
                    body = {"model": "mock-model", "prompt": f"sidecar {i}", "max_tokens": 2}
                    async with http.post(envoy.url + "/v1/completions", json=body) as r:
                        await r.read()
                        assert r.status == 200, envoy.log_tail()
                        served.add(r.headers.get("x-inference-port"))
                assert served and served <= {h.split(":")[1] for h in fleet.hostports}
