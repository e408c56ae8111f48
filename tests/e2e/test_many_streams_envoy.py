"""More requests in flight than Envoy's default circuit breakers allow, through the shipped Envoy config.

Every request holds one ext_proc stream for as long as it runs: an LLM response streams for seconds,
so a gateway fronting a few model servers has thousands of them open.  Envoy's default breakers
allow 1,024 requests at once on a cluster; on the EPP's cluster the 1,025th fails with a 500 (the
stat ``upstream_rq_active_overflow``), whatever the model servers' cluster allows.  The shipped
configs (deploy/envoy/*.yaml, the chart's proxy, the demo's ``EnvoyConfig``) raise them as they
raise the model servers'.  Envoy opens a connection to the EPP per 100 streams (the configs' cap),
below the EPP's ``--grpc-max-concurrent-streams`` (1,000): no stream is refused either.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import yaml

from epp_sim.demo.envoy import Envoy, EnvoyConfig, render
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.deploy.envoy import ENVOY_DIR, cluster, validate
from tests.e2e.conftest import QUICK_STOP

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IN_FLIGHT = 1200  # above Envoy's default 1,024 requests at once
# slow enough that every request is still streaming when the last one starts
SLOW_SIM = ("--time-scale", "0.5", "--seed", "7", "--max-model-len", "131072")


async def _stream(http: aiohttp.ClientSession, url: str, i: int) -> int:
    body = {"model": "mock-model", "prompt": f"held {i}", "max_tokens": 40, "stream": True}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        await r.read()
        return r.status


async def test_more_requests_in_flight_than_envoys_default_breakers_all_succeed() -> None:
    async with SimFleet(2, *SLOW_SIM) as fleet:
        epp = EppProcess(f"--endpoints={','.join(fleet.hostports)}", QUICK_STOP)
        async with epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as proxy:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                assert await _stream(http, proxy.url, -1) == 200  # the connection up, SETTINGS read
                statuses = await asyncio.gather(*(_stream(http, proxy.url, i) for i in range(IN_FLIGHT)))
                stats = await proxy.stats()
            counts = {s: statuses.count(s) for s in set(statuses)}
            assert counts == {200: IN_FLIGHT}, (counts, proxy.log_tail())
            assert stats.get("cluster.ext_proc.upstream_rq_active_overflow", 0) == 0
            # more than 1,024 streams were open at once (past Envoy's default breaker): Envoy opened
            # a connection per 100 (its cap a connection, EnvoyConfig.ext_proc_streams_per_connection)
            assert stats["cluster.ext_proc.upstream_cx_total"] >= 11, stats
            assert stats.get("cluster.ext_proc.upstream_rq_rx_reset", 0) == 0  # no stream refused


def _breakers(config: dict[str, object], name: str) -> dict[str, int]:
    (thresholds,) = cluster(config, name)["circuit_breakers"]["thresholds"]
    return {k: int(v) for k, v in thresholds.items()}


def _streams_per_connection(config: dict[str, object]) -> int:
    options = cluster(config, "ext_proc")["typed_extension_protocol_options"]
    (http,) = options.values()
    return int(http["explicit_http_config"]["http2_protocol_options"]["max_concurrent_streams"])


@pytest.mark.parametrize("name", ["gie.yaml", "lean.yaml", "fail-open.yaml", "active-active.yaml"])
def test_every_shipped_config_lets_the_epp_cluster_hold_what_the_model_servers_do(name: str) -> None:
    """Envoy accepts the file; the EPP's cluster has the model servers' breakers, and caps a
    connection's streams so that one Envoy thread reaches every EPP worker
    (tests/e2e/test_workers_envoy.py)."""
    out = validate(ENVOY_DIR / name)
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load((ENVOY_DIR / name).read_text())
    assert _breakers(config, "ext_proc") == _breakers(config, "original_destination_cluster")
    assert _breakers(config, "ext_proc")["max_requests"] >= 40000
    assert _streams_per_connection(config) == EnvoyConfig().ext_proc_streams_per_connection


def test_the_demo_config_lets_the_epp_cluster_hold_what_the_model_servers_do() -> None:
    config = render(EnvoyConfig(ext_proc_port=9002, upstreams=["127.0.0.1:8000"]))
    assert _breakers(config, "ext_proc") == _breakers(config, "original_destination_cluster")
    assert _streams_per_connection(config) == 100
