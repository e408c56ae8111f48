"""prefill-load-scorer's backlog shared between two real EPP processes over the sync hub.

A long prompt routed by replica A sits in the engine's prefill for seconds (slow simulator);
replica B, which never saw the request, must count it in that engine's backlog while it lasts
and drop it once A's response has started.  Without sharing, four replicas each saw a quarter
of every engine's queued prefill and herded bursts (bench/scaleout part ``quality``).
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import aiohttp
import pytest

from epp.testing.waiting import until_async
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port_pair
from tests.e2e.conftest import QUICK_STOP, both_serving

pytestmark = pytest.mark.e2e

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: prefill-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: prefill-load-scorer
"""
# 20,000 characters = 5,000 simulator tokens: 250 ms of modelled prefill, x10 in wall time: 2.5 s
# for B to hear of it (a sync tick is ~0.1 s) before the first byte ends it
SLOW_SIM = ("--time-scale", "10", "--seed", "7", "--max-model-len", "131072")
PROMPT = "a long shared system prompt " * 715


async def _state(http: aiohttp.ClientSession, epp: EppProcess) -> dict[str, Any]:
    async with http.get(f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state") as r:
        doc: dict[str, Any] = await r.json()
    plugin: dict[str, Any] = doc["plugins"]["prefill-load-scorer"]
    return plugin


async def test_a_peers_pending_prefill_counts_on_this_replica(tmp_path: pathlib.Path) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    pa, pb = free_port_pair(), free_port_pair()
    async with SimFleet(2, *SLOW_SIM) as fleet:
        common = (
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
            f"--config-file={tmp_path / 'config.yaml'}",
            f"--peers=127.0.0.1:{pa},127.0.0.1:{pb}",
        )
        a = EppProcess(*common, f"--peer-port={pa}", "--replica-id=epp-a")
        b = EppProcess(*common, f"--peer-port={pb}", "--replica-id=epp-b")
        async with both_serving(a, b):
            # Envoy sends everything to A: whatever B knows of the backlog came from A
            cfg = EnvoyConfig(ext_proc_port=a.grpc_port)
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                body = {"model": "mock-model", "prompt": PROMPT, "max_tokens": 2, "stream": True}
                first_byte = asyncio.Event()

                async def one() -> int:
                    async with http.post(f"{proxy.url}/v1/completions", json=body) as r:
                        async for _ in r.content.iter_any():
                            first_byte.set()
                        return r.status

                request = asyncio.create_task(one())
                held: dict[str, Any] = {}

                async def b_counts_it() -> bool:
                    held.update(await _state(http, b))
                    return bool(held["backlog"]) or first_byte.is_set()

                await until_async(b_counts_it, 10, what="B never heard of A's pending prefill")
                assert not first_byte.is_set(), "the prefill ended before B was asked"
                assert held["own"] == {}  # B routed nothing itself
                [(endpoint, tokens)] = held["backlog"].items()
                assert tokens > 4000  # the prompt's ~5,000 tokens, none of them cached yet
                assert held["peers"] == {"epp-a": {endpoint: tokens}}
                assert (await _state(http, a))["own"] == {endpoint: tokens}

                assert await request == 200

                async def b_released_it() -> bool:
                    return not (await _state(http, b))["backlog"]

                await until_async(b_released_it, 10, what="B kept A's finished prefill in its backlog")
