"""``declinedProfile`` end to end: real Envoy, EPP, simulator pods with roles and decode proxies.

On 2 prefill + 2 decode pods (``PdFleet``), a request the prefix-based decider declines is served
whole by the declined profile's pick — here a ``prefill``-role pod, which (a vLLM with
``kv_role: kv_both`` on the pool port) serves a plain request as any pod does — and a long new
prompt is still disaggregated: decoded on a decode pod behind its proxy, prefilled on a prefill pod.
The declined profile of this test keeps only prefill pods, so the test knows where a declined
request must go; the benchmark's (bench/configs/pd-prefix-declined.yaml) keeps every pod.
"""

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
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 64}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
    declinedProfile: whole
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: whole
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


def sample(metrics: str, family: str, *labels: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(family + "{") and all(label in line for label in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_declined_request_runs_whole_on_a_prefill_pod_and_a_long_one_is_disaggregated(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    async with PdFleet(2, 2, *FAST_SIM) as fleet:
        entries = fleet.endpoints()
        role = {e["name"]: e["labels"][PdFleet.ROLE_LABEL] for e in entries}
        pool = {e["name"]: f"{e['address']}:{e['port']}" for e in entries}
        epp = EppProcess(
            f"--endpoints-file={fleet.write_endpoints_file(tmp_path / 'endpoints.yaml')}",
            f"--config-file={tmp_path / 'config.yaml'}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
            "--decisions-buffer-size=4",
        )
        envoy = Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port))
        async with epp, envoy, aiohttp.ClientSession() as http:
            status, headers = await chat(http, envoy.url, "hi, short")  # declined
            assert status == 200
            served = headers["x-inference-pod"]
            assert role[served] == "prefill", headers
            assert "x-pd-prefiller" not in headers  # no proxy, no prefill leg
            proxies = [await get(http, f"http://{hp}/pdproxy/state") for hp in fleet.decode_hostports]
            assert sum(p["plain"] + p["prefill_legs"] for p in proxies) == 0  # no decode pod saw it
            engines = {hp: (await get(http, f"http://{hp}/sim/state"))["engine"] for hp in fleet.engines}
            assert engines[pool[served]]["prefill_legs"] == 0  # a whole request, not a prefill leg

            status, headers = await chat(http, envoy.url, LONG)  # ~400 new tokens: disaggregated
            assert status == 200
            assert role[headers["x-inference-pod"]] == "decode"
            prefiller = headers["x-pd-prefiller"]
            assert prefiller in fleet.prefill_hostports
            engines = {hp: (await get(http, f"http://{hp}/sim/state"))["engine"] for hp in fleet.engines}
            assert engines[prefiller]["prefill_legs"] == 1
            assert sum(e["kv_transfers"] for e in engines.values()) == 1

            base = f"http://127.0.0.1:{epp.metrics_port}"
            async with http.get(base + "/metrics") as r:
                metrics = await r.text()
            assert sample(metrics, "llm_d_epp_pd_decision_total", 'decision_type="decode-only"') == 1
            assert sample(metrics, "llm_d_epp_pd_decision_total", 'decision_type="prefill-decode"') == 1
            assert sample(metrics, "epp_pd_declined_total", 'profile="whole"') == 1
            decisions = (await get(http, base + "/debug/decisions"))["decisions"]
            declined = next(d for d in decisions if d["disagg"]["reason"] == "decider_declined")
            assert declined["primaryProfile"] == "whole"
            assert declined["disagg"]["declinedProfile"] == "whole"
            assert declined["destination"] == pool[served]
            assert [run["profile"] for run in declined["profiles"]] == ["decode", "whole"]
