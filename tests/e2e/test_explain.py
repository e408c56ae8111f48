"""Explained decisions through a real Envoy: the trusted header, the breakdown, /debug/decisions."""

from __future__ import annotations

import pathlib
from typing import Any

import orjson
import pytest

from epp.explain.record import SCORES_HEADER, parse_header
from tests.e2e.conftest import Stack, make_stack

pytestmark = pytest.mark.e2e

MODEL = "mock-model"
EXPLAIN = "x-epp-explain"
# GIE's default profile: these scorers, weight 1 each (config/load.py DEFAULT_CONFIG_YAML).
PD_CONFIG = (
    pathlib.Path(__file__).resolve().parents[2] / "config/examples/sim-pd-epp-config.yaml"
).read_text()
DEFAULT_SCORERS = {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}


async def _decision(s: Stack) -> dict[str, Any]:
    """The newest decision, fetched again by its request id (Envoy replaces a client's x-request-id
    on external requests, so the id is learnt from the buffer)."""
    url = f"http://127.0.0.1:{s.epp.metrics_port}/debug/decisions"
    async with s.http.get(url, params={"limit": "1"}) as resp:
        assert resp.status == 200
        [newest] = (await resp.json())["decisions"]
    async with s.http.get(url, params={"request_id": newest["requestId"]}) as resp:
        [decision] = (await resp.json())["decisions"]
    assert decision == newest
    return decision  # type: ignore[no-any-return]


async def test_trusted_header_yields_breakdown_and_decisions_keeps_the_request(
    tmp_path: pathlib.Path,
) -> None:
    args = [f"--explain-request-header={EXPLAIN}", "--decisions-buffer-size=16"]
    async with make_stack(tmp_path, epp_args=args) as s:
        body = {"model": MODEL, "prompt": "why here? " * 20, "max_tokens": 2}
        r = await s.post("/v1/completions", body, headers={EXPLAIN: "1"})
        assert r.status == 200
        rows = parse_header(r.headers[SCORES_HEADER])
        assert {address for address, _, _ in rows} == set(s.fleet.hostports)
        assert rows[0][0] == r.epp_choice == r.served_by  # the pick first, and it served the request
        for _, total, parts in rows:
            assert set(parts) >= DEFAULT_SCORERS
            assert total == pytest.approx(sum(parts.values()), abs=1e-5)

        # The same breakdown reached Envoy's envoy.lb metadata (the access log prints it).
        line = await s.access_log_line("/v1/completions")
        breakdown = orjson.loads(line.split("breakdown=", 1)[1].split(" prefiller=", 1)[0])
        assert breakdown == {address: pytest.approx(parts, abs=1e-5) for address, _, parts in rows}

        decision = await _decision(s)
        assert decision["outcome"] == "routed" and decision["destination"] == r.epp_choice
        assert decision["model"] == MODEL and decision["admission"] == "admitted"
        [run] = decision["profiles"]
        assert {e["address"] for e in run["endpoints"]} == set(s.fleet.hostports)
        assert {"parse", "schedule"} <= set(decision["stagesMicros"])

        # A request without the header is recorded but gets nothing on the wire.
        r = await s.post("/v1/completions", body)
        assert r.status == 200 and SCORES_HEADER not in r.headers
        assert (await _decision(s))["destination"] == r.epp_choice

        # A rejection is recorded with its reason.
        r = await s.post("/v1/completions", {"prompt": "no model"})
        assert r.status == 400
        bad = await _decision(s)
        assert (bad["outcome"], bad["reason"]) == ("rejected", "rejected-bad-request")


async def test_without_the_flag_the_client_header_does_nothing(stack: Stack) -> None:
    r = await stack.post(
        "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}, headers={EXPLAIN: "1"}
    )
    assert r.status == 200 and SCORES_HEADER not in r.headers
    line = await stack.access_log_line("/v1/completions")
    assert "breakdown=- " in line
    async with stack.http.get(f"http://127.0.0.1:{stack.epp.metrics_port}/debug/decisions") as resp:
        assert resp.status == 404  # the buffer is off by default


async def test_explained_request_in_lean_buffered_mode_still_gets_its_response_header(
    tmp_path: pathlib.Path,
) -> None:
    """BUFFERED request bodies with allow_mode_override: the EPP asks Envoy to skip the response
    unless something needs it; an explained request needs its response headers (the breakdown
    header), and the routing reply is the RequestBody message that carries the metadata."""
    envoy = {"request_body_mode": "BUFFERED", "response_body_mode": "STREAMED", "allow_mode_override": True,
             "buffer_limit_bytes": 1 << 20}  # fmt: skip
    async with make_stack(tmp_path, envoy=envoy, epp_args=[f"--explain-request-header={EXPLAIN}"]) as s:
        body = {"model": MODEL, "prompt": "lean and explained", "max_tokens": 2}
        r = await s.post("/v1/completions", body, headers={EXPLAIN: "yes"})
        assert r.status == 200
        rows = parse_header(r.headers[SCORES_HEADER])
        assert rows[0][0] == r.epp_choice and {a for a, _, _ in rows} == set(s.fleet.hostports)
        line = await s.access_log_line("/v1/completions")
        assert set(orjson.loads(line.split("breakdown=", 1)[1].split(" prefiller=", 1)[0])) == set(
            s.fleet.hostports
        )
        r = await s.post("/v1/completions", body)  # not asked: the lean path, no header
        assert r.status == 200 and SCORES_HEADER not in r.headers


@pytest.mark.slow
async def test_pd_request_explained_shows_both_legs(tmp_path: pathlib.Path) -> None:
    """llm-d's sim-pd-epp-config on a role-labelled fleet: the response header describes the
    decode (primary) leg, and /debug/decisions keeps both profile runs and the prefill pick."""
    roles = ["prefill", "decode", "prefill", "decode"]
    async with make_stack(
        tmp_path,
        replicas=4,
        config=PD_CONFIG,
        labels=[{"llm-d.ai/role": r} for r in roles],
        epp_args=[f"--explain-request-header={EXPLAIN}", "--decisions-buffer-size=4"],
    ) as s:
        hostports = s.fleet.hostports
        decode = {hostports[i] for i, r in enumerate(roles) if r == "decode"}
        prefill = {hostports[i] for i, r in enumerate(roles) if r == "prefill"}
        long = "a fresh prompt that no pod has seen before, long enough to need a prefill leg " * 8
        r = await s.post(
            "/v1/completions", {"model": MODEL, "prompt": long, "max_tokens": 2}, headers={EXPLAIN: "1"}
        )
        assert r.status == 200, r.body
        assert {address for address, _, _ in parse_header(r.headers[SCORES_HEADER])} == decode
        decision = await _decision(s)
        runs = {run["profile"]: run for run in decision["profiles"]}
        assert set(runs) == {"decode", "prefill"} and decision["primaryProfile"] == "decode"
        assert decision["destination"] == r.served_by
        assert decision["disagg"]["decisionType"] == "prefill-decode"
        assert decision["disagg"]["prefill"] in prefill and runs["prefill"]["picked"] == [
            decision["disagg"]["prefill"]
        ]
