"""P/D through real Envoy: llm-d's sim-pd-epp-config on a fleet with llm-d.ai/role labels.

The simulator does not play P/D roles here (branch ``pd-sim`` adds prefill pods and the decode
proxy); these tests check the EPP's half: the request goes to a decode-role pod, the upstream
request carries ``x-prefiller-host-port`` naming a prefill-role pod (Envoy's access log prints
the request header as sent upstream, after ext_proc's mutation), a client's value of that
header never reaches the pod, and without a prefill pod the client gets a 503 with the
dropped reason.
"""

from __future__ import annotations

import pathlib

import pytest

from epp.testing.waiting import until
from tests.e2e.conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "config" / "examples"
CONFIG = (EXAMPLES / "sim-pd-epp-config.yaml").read_text()
ROLE = "llm-d.ai/role"
MODEL = "mock-model"
LONG = "a fresh prompt that no pod has seen before, long enough to need a prefill leg " * 8


def _prefiller(line: str) -> str:
    return line.split("prefiller=", 1)[1].split(" ", 1)[0]


async def test_prefill_header_reaches_the_decode_pod_and_client_values_never_do(
    tmp_path: pathlib.Path,
) -> None:
    roles = ["prefill", "decode", "prefill", "decode"]
    async with make_stack(tmp_path, replicas=4, config=CONFIG, labels=[{ROLE: r} for r in roles]) as s:
        hostports = s.fleet.hostports
        decode = {hostports[i] for i, r in enumerate(roles) if r == "decode"}
        prefill = {hostports[i] for i, r in enumerate(roles) if r == "prefill"}

        forged = "10.66.66.66:6666"
        r = await s.post(
            "/v1/completions",
            {"model": MODEL, "prompt": LONG, "max_tokens": 4},
            headers={"x-prefiller-host-port": forged, "x-request-id": "pd-long"},
        )
        assert r.status == 200, r.body
        assert r.served_by in decode

        # A short prompt: fewer than 16 uncached tokens, the decider declines; the forged header is gone.
        r = await s.post(
            "/v1/completions",
            {"model": MODEL, "prompt": "hi", "max_tokens": 4},
            headers={"x-prefiller-host-port": forged},
        )
        assert r.status == 200, r.body
        assert r.served_by in decode
        log = tmp_path / "access.log"
        await until(
            lambda: log.exists() and log.read_text().count("ACCESS ") >= 2, what="two access-log lines"
        )
        first, second = [ln for ln in log.read_text().splitlines() if ln.startswith("ACCESS ")][:2]
        assert _prefiller(first) in prefill
        assert _prefiller(second) == "-"  # declined: no header upstream, the forged one stripped
        assert forged not in log.read_text()
        metrics = await s.epp_metrics()
        assert _sample(metrics, "llm_d_epp_pd_decision_total", "prefill-decode") == 1
        assert _sample(metrics, "llm_d_epp_pd_decision_total", "decode-only") == 1
        assert _sample(metrics, "llm_d_epp_disagg_decision_total", "prefill-decode") == 1


def _sample(metrics: str, family: str, decision: str) -> float:
    """The value of ``family``'s series for ``decision`` (each test starts its own EPP)."""
    for line in metrics.splitlines():
        if line.startswith(family + "{") and f'decision_type="{decision}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("example", ["sim-pd-epp-config.yaml", "pd-disaggregation.yaml"])
async def test_no_prefill_pod_is_a_503_with_the_dropped_reason(tmp_path: pathlib.Path, example: str) -> None:
    config = (EXAMPLES / example).read_text()
    async with make_stack(
        tmp_path, replicas=2, config=config, labels=[{ROLE: "decode"}, {ROLE: "decode"}]
    ) as s:
        r = await s.post("/v1/completions", {"model": MODEL, "prompt": LONG, "max_tokens": 4})
        assert r.status == 503, r.body
        assert r.headers.get("x-llm-d-request-dropped-reason") == "prefill_unavailable"
        metrics = await s.epp_metrics()
        assert _sample(metrics, "llm_d_epp_disagg_decision_total", "prefill-unavailable") == 1
        assert _sample(metrics, "llm_d_epp_disagg_decision_total", "decode-only") == 0
