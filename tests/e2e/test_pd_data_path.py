"""P/D end to end on the data path: llm-d's P/D config routes through real Envoy to prefill pods and
decode pods behind the project's decode proxy (test_pd.py checks the EPP's half on plain pods); no
ready prefill pod is a 503, never a silent decode-only answer."""

from __future__ import annotations

import contextlib
import pathlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, PdFleet
from tests.e2e.conftest import QUICK_STOP

from .conftest import FAST_SIM

pytestmark = pytest.mark.e2e

# llm-d-router's deploy/config/sim-pd-epp-config.yaml, as the EPP's examples ship it
LLMD_SIM_PD_CONFIG = (
    pathlib.Path(__file__).resolve().parents[2] / "config/examples/sim-pd-epp-config.yaml"
).read_text()
LONG_PROMPT = "prefill and decode are different phases of inference " * 30  # ~400 tokens
SHORT_PROMPT = "hi"


@dataclass(slots=True)
class PdStack:
    fleet: PdFleet
    epp: EppProcess
    envoy: Envoy
    http: aiohttp.ClientSession

    async def chat(
        self, prompt: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        body = {
            "model": "mock-model",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 5,
            "stream": True,
        }
        async with self.http.post(self.envoy.url + "/v1/chat/completions", json=body, headers=headers) as r:
            return r.status, dict(r.headers), await r.read()

    async def get(self, url: str) -> Any:
        async with self.http.get(url) as r:
            return await r.json()

    async def proxy_state(self) -> dict[str, Any]:
        state: dict[str, Any] = await self.get(f"http://{self.fleet.decode_hostports[0]}/pdproxy/state")
        return state

    async def engine(self, hostport: str) -> dict[str, Any]:
        state: dict[str, Any] = (await self.get(f"http://{hostport}/sim/state"))["engine"]
        return state

    async def pd_decisions(self) -> dict[str, float]:
        async with self.http.get(f"http://127.0.0.1:{self.epp.metrics_port}/metrics") as r:
            text = await r.text()
        pattern = r'^llm_d_epp_pd_decision_total\{[^}]*decision_type="([^"]+)"[^}]*\} (\S+)$'
        return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


@contextlib.asynccontextmanager
async def pd_stack(tmp: pathlib.Path, prefill: int, decode: int) -> AsyncIterator[PdStack]:
    (tmp / "config.yaml").write_text(LLMD_SIM_PD_CONFIG)
    async with PdFleet(prefill, decode, *FAST_SIM) as fleet:
        endpoints = fleet.write_endpoints_file(tmp / "endpoints.yaml")
        epp = EppProcess(
            f"--endpoints-file={endpoints}",
            f"--config-file={tmp / 'config.yaml'}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
        )
        envoy = Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port))
        async with epp, envoy, aiohttp.ClientSession() as http:
            try:
                yield PdStack(fleet, epp, envoy, http)
            except BaseException:
                print("---- epp log ----\n", epp.log_tail())
                raise


async def test_llm_d_pd_config_prefills_on_the_prefill_pod_and_decodes_behind_the_proxy(
    tmp_path: pathlib.Path,
) -> None:
    async with pd_stack(tmp_path, prefill=1, decode=1) as pd:
        status, headers, body = await pd.chat(LONG_PROMPT)
        assert status == 200, body
        assert body.count(b'"content":"') - 1 == 5
        prefiller = pd.fleet.prefill_hostports[0]
        assert headers["x-pd-prefiller"] == prefiller  # the EPP's header reached the decode proxy
        assert headers["x-inference-pod"] == "decode-0"
        proxy = await pd.proxy_state()
        assert proxy["prefill_legs"] == 1 and proxy["prefillers"] == {prefiller: 1}
        assert (await pd.engine(prefiller))["prefill_legs"] == 1  # the prefill pod served the prefill leg
        assert pd.fleet.decode is not None
        assert (await pd.engine(pd.fleet.decode.hostports[0]))["kv_transfers"] == 1  # the decoder decoded
        assert (await pd.pd_decisions()).get("prefill-decode") == 1


async def test_a_client_cannot_choose_the_prefiller(tmp_path: pathlib.Path) -> None:
    """A client's x-prefiller-host-port never reaches the proxy: replaced when the decider
    disaggregates, removed when it declines (the prompt is then cached on the decode pod)."""
    injected = {"x-prefiller-host-port": "127.0.0.1:1"}
    async with pd_stack(tmp_path, prefill=1, decode=1) as pd:
        prefiller = pd.fleet.prefill_hostports[0]
        status, headers, _ = await pd.chat(LONG_PROMPT, headers=injected)
        assert status == 200
        assert headers["x-pd-prefiller"] == prefiller
        status, headers, _ = await pd.chat(LONG_PROMPT, headers=injected)  # now cached on the decode pick
        assert status == 200
        assert "x-pd-prefiller" not in headers
        proxy = await pd.proxy_state()
        assert proxy["prefillers"] == {prefiller: 1} and proxy["plain"] >= 1
        assert (await pd.pd_decisions()) == {"prefill-decode": 1, "decode-only": 1}


async def test_no_ready_prefill_pod_is_a_503_not_a_decode_only_answer(tmp_path: pathlib.Path) -> None:
    async with pd_stack(tmp_path, prefill=0, decode=1) as pd:
        status, _, body = await pd.chat(LONG_PROMPT)
        assert status == 503, body
        proxy = await pd.proxy_state()
        assert proxy["prefill_legs"] == 0 and proxy["plain"] == 0  # no inference request reached it
        assert pd.fleet.decode is not None
        assert (await pd.engine(pd.fleet.decode.hostports[0]))["steps"] == 0
