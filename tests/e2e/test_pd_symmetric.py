"""P/D on a symmetric fleet end to end: every pod ``prefill-decode`` and behind the decode proxy.

The prefix-based decider disaggregates long uncached prompts: the prefill leg goes to another pod
(``exclude-peer-filter``), through that pod's proxy as a plain request; short prompts are declined
and served whole by the decode pick.  Real Envoy, EPP and simulator processes."""

from __future__ import annotations

import pathlib

import aiohttp
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, PdFleet
from tests.e2e.conftest import QUICK_STOP

from .conftest import FAST_SIM
from .pd_client import LONG, chat, get

pytestmark = pytest.mark.e2e

PODS = 3
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 16, autoTune: false}
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: exclude-peer-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 64}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: exclude-peer-filter
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
  - pluginRef: max-score-picker
"""


async def test_symmetric_fleet_prefills_elsewhere_and_serves_short_prompts_whole(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    async with PdFleet(0, 0, *FAST_SIM, prefill_decode=PODS) as fleet:
        entries = fleet.endpoints()
        assert {e["labels"][PdFleet.ROLE_LABEL] for e in entries} == {"prefill-decode"}
        pool = {e["name"]: f"{e['address']}:{e['port']}" for e in entries}  # name -> proxy
        epp = EppProcess(
            f"--endpoints-file={fleet.write_endpoints_file(tmp_path / 'endpoints.yaml')}",
            f"--config-file={tmp_path / 'config.yaml'}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
        )
        envoy = Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port))
        async with epp, envoy, aiohttp.ClientSession() as http:
            pairs = []
            for i in range(6):  # distinct prompts: nothing cached, every one disaggregated
                status, headers = await chat(http, envoy.url, f"request {i}: " + LONG)
                assert status == 200
                pairs.append((pool[headers["x-inference-pod"]], headers["x-pd-prefiller"]))
            assert all(decoder != prefiller for decoder, prefiller in pairs)
            assert {p for _, p in pairs} <= set(pool.values())
            proxies = {hp: await get(http, f"http://{hp}/pdproxy/state") for hp in pool.values()}
            assert sum(p["prefill_legs"] for p in proxies.values()) == 6
            for hp, state in proxies.items():
                assert hp not in state["prefillers"]  # never paired with itself
                # every prefill leg this pod served came through its proxy as a plain request
                assert state["plain"] == sum(1 for _, p in pairs if p == hp)
            assert fleet.prefill_decode is not None
            engines = [(await get(http, f"http://{hp}/sim/state"))["engine"] for hp in fleet.engines]
            assert sum(e["prefill_legs"] for e in engines) == 6
            assert sum(e["kv_transfers"] for e in engines) == 6

            status, headers = await chat(http, envoy.url, "hi")  # short: declined, served whole
            assert status == 200
            assert "x-pd-prefiller" not in headers
            served = pool[headers["x-inference-pod"]]
            after = {hp: await get(http, f"http://{hp}/pdproxy/state") for hp in pool.values()}
            assert after[served]["plain"] == proxies[served]["plain"] + 1
            assert sum(p["prefill_legs"] for p in after.values()) == 6  # no new prefill leg
