"""Two EPP processes sharing routing state behind one real Envoy (active-active, no Kubernetes)."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re

import aiohttp
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port_pair
from tests.e2e.conftest import FAST_SIM, QUICK_STOP, both_serving

pytestmark = pytest.mark.e2e

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: test-routed-counter
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: prefix-cache-scorer
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: token-load-scorer
"""


def _plugin_site(tmp: pathlib.Path) -> pathlib.Path:
    """A directory on PYTHONPATH declaring the test plugin as an ``epp.plugins`` entry point:
    the real EPP loads it the way it loads any out-of-tree plugin."""
    dist = tmp / "site" / "epp_sync_test_plugins-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epp-sync-test-plugins\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[epp.plugins]\ntest-routed-counter = epp.testing.replicated:RoutedCounter\n"
    )
    return tmp / "site"


def _value(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


async def _metrics(http: aiohttp.ClientSession, epp: EppProcess) -> str:
    async with http.get(f"http://127.0.0.1:{epp.metrics_port}/metrics") as r:
        return await r.text()


async def test_two_replicas_behind_one_envoy_share_their_routing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    env = {"PYTHONPATH": str(_plugin_site(tmp_path))}
    pa, pb = free_port_pair(), free_port_pair()
    async with SimFleet(3, *FAST_SIM) as fleet:
        common = (
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
            f"--config-file={tmp_path / 'config.yaml'}",
        )
        # each is given the whole list, itself included (as a shared ConfigMap would), and the
        # shared secret the chart mounts: every Publish call and snapshot is authenticated
        peers = f"--peers=127.0.0.1:{pa},127.0.0.1:{pb}"
        (tmp_path / "peer-secret").write_text("e2e-peer-secret-0123456789\n")
        secret = f"--peer-secret-file={tmp_path / 'peer-secret'}"
        a = EppProcess(*common, peers, secret, f"--peer-port={pa}", "--replica-id=epp-a", env=env)
        b = EppProcess(*common, peers, secret, f"--peer-port={pb}", "--replica-id=epp-b", env=env)
        async with both_serving(a, b):
            for epp in (a, b):  # the real plugins are shared beside the test one
                started = next(
                    json.loads(x) for x in epp.log_path.read_text().splitlines() if "sync_started" in x
                )
                assert started["authenticated"] == "every call and snapshot"
                assert {
                    "approx-prefix-cache-producer/approx-prefix-cache-producer",
                    "inflight-load-producer/inflight-load-producer",
                    "test-routed-counter/test-routed-counter",
                } <= set(started["shared"])
            cfg = EnvoyConfig(
                ext_proc_port=a.grpc_port,
                ext_proc_replicas=[(a.grpc_port, a.health_port), (b.grpc_port, b.health_port)],
                ext_proc_health_service="inference-extension",
            )
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                body = {"model": "mock-model", "prompt": "hello", "max_tokens": 4}

                async def one(i: int) -> int:
                    async with http.post(f"{proxy.url}/v1/completions", json=body) as r:
                        await r.read()
                        return r.status

                statuses = await asyncio.gather(*(one(i) for i in range(60)))
                assert statuses == [200] * 60
                seen: dict[str, str] = {}

                async def both_received() -> bool:
                    for name, epp in (("a", a), ("b", b)):
                        seen[name] = await _metrics(http, epp)
                    return all(
                        _value(m, "epp_sync_batches_received_total") > 0
                        and _value(m, "epp_sync_batches_sent_total") > 0
                        and 'epp_sync_peers{state="connected"} 1.0' in m
                        for m in seen.values()
                    )

                async with asyncio.timeout(10):
                    while not await both_received():
                        statuses = await asyncio.gather(*(one(i) for i in range(10)))  # more traffic
                for m in seen.values():
                    assert 'epp_sync_peers{state="connected"} 1.0' in m
                    assert _value(m, "epp_sync_partitioned") == 0
                    assert "epp_sync_rejected_total{" not in m  # the real plugins' deltas all apply
