"""llm-d-router's file-discovery through a real Envoy: the EPP runs with no discovery flag, finds
the simulated replicas in the config's endpoints file, and follows the file when it changes."""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.e2e.conftest import FAST_SIM, QUICK_STOP, Reply, Stack

pytestmark = pytest.mark.e2e

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters:
    path: {path}
    watchFile: true
- type: queue-scorer
- type: max-score-picker
- type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: file-discovery
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def _endpoints(port: int) -> str:
    return f'endpoints:\n- {{name: vllm, address: "127.0.0.1", port: "{port}"}}\n'


async def _served_by(stack: Stack) -> str:
    reply: Reply = await stack.post(
        "/v1/completions", {"model": "mock-model", "prompt": "hi", "max_tokens": 1}
    )
    assert reply.status == 200, reply.body
    return reply.served_by


async def test_endpoints_come_from_the_file_and_follow_it(tmp_path: pathlib.Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    (tmp_path / "config.yaml").write_text(CONFIG.format(path=endpoints))
    async with SimFleet(2, *FAST_SIM) as fleet:
        first, second = fleet.hostports
        endpoints.write_text(_endpoints(fleet.ports[0]))
        epp = EppProcess(
            f"--config-file={tmp_path / 'config.yaml'}", "--bind-address=127.0.0.1", "--v=3", QUICK_STOP
        )
        async with (
            epp,
            Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as proxy,
            aiohttp.ClientSession() as http,
        ):
            stack = Stack(fleet, epp, proxy, http, tmp_path)
            try:
                assert {await _served_by(stack) for _ in range(4)} == {first}
                endpoints.write_text(_endpoints(fleet.ports[1]))
                async with asyncio.timeout(15):  # the file is polled every second
                    while await _served_by(stack) != second:  # noqa: ASYNC110 - another process reloads
                        await asyncio.sleep(0.2)  # poll interval while the reload lands
                assert {await _served_by(stack) for _ in range(4)} == {second}
            except BaseException:
                print("---- epp log ----\n", epp.log_tail(), "\n---- envoy log ----\n", proxy.log_tail())
                raise
