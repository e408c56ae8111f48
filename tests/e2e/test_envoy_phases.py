"""Which ext_proc phases Envoy 1.40 sends the EPP under the shipped Envoy configs (docs/envoy.md).

The lean config (deploy/envoy/lean.yaml) is read from the file, so these tests check the config we
ship: with no plugin reading the response, two messages per request reach the EPP; a plugin that
reads usage still gets every chunk; an override the config does not list is ignored by Envoy
(the response then flows and is answered as usual); with GIE's FULL_DUPLEX_STREAMED config every
chunk flows.
"""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import FAST_SIM, Stack, make_stack

pytestmark = pytest.mark.e2e
MODEL = "mock-model"

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"
SENT = "http.inference.ext_proc.stream_msgs_sent"
STREAMED = {"model": MODEL, "prompt": "phases", "max_tokens": 12, "stream": True}


def shipped_ext_proc(name: str) -> dict[str, Any]:
    """The ext_proc filter's typed_config of deploy/envoy/<name>."""
    doc = yaml.safe_load((ROOT / "deploy" / "envoy" / name).read_text())
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (ext_proc,) = (
        f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"
    )
    return dict(ext_proc)


def lean_envoy(name: str = "lean.yaml", **changes: Any) -> dict[str, Any]:
    """EnvoyConfig overrides reproducing a shipped config's ext_proc processing settings."""
    cfg = shipped_ext_proc(name)
    mode = cfg["processing_mode"]
    extra = {"allowed_override_modes": cfg["allowed_override_modes"], **changes}
    return {
        "request_body_mode": mode["request_body_mode"],
        "response_body_mode": mode["response_body_mode"],
        "response_header_mode": mode["response_header_mode"],
        "request_trailer_mode": mode["request_trailer_mode"],
        "response_trailer_mode": mode["response_trailer_mode"],
        "allow_mode_override": cfg["allow_mode_override"],
        "failure_mode_allow": cfg["failure_mode_allow"],
        "buffer_limit_bytes": 1 << 20,
        "extra_ext_proc": extra,
    }


async def messages_per_request(s: Stack, body: dict[str, Any], n: int = 4) -> float:
    """ext_proc messages Envoy sent per request for ``n`` streamed requests, each answered in full."""
    before = (await s.envoy.stats())[SENT]
    for _ in range(n):
        r = await s.post("/v1/completions", body)
        assert r.status == 200 and r.body.rstrip().endswith(b"data: [DONE]"), r.body[-200:]
    return ((await s.envoy.stats())[SENT] - before) / n


async def test_lean_config_sends_only_the_request_when_no_plugin_reads_the_response(
    tmp_path: pathlib.Path,
) -> None:
    async with make_stack(tmp_path, envoy=lean_envoy()) as s:
        assert await messages_per_request(s, STREAMED) == 2  # request headers + buffered body


async def test_lean_config_still_sends_every_chunk_to_a_usage_plugin(tmp_path: pathlib.Path) -> None:
    """GIE's contract where a plugin needs the data: the reporter reads usage from the last event."""
    config = (EXAMPLES / "request-attribute-reporter.yaml").read_text()
    async with make_stack(tmp_path, config=config, sim_args=FAST_SIM, envoy=lean_envoy()) as s:
        body = {**STREAMED, "max_tokens": 7, "ignore_eos": True, "stream_options": {"include_usage": True}}
        assert await messages_per_request(s, body, n=2) > 3  # response headers and body chunks too
        line = await s.access_log_line("POST /v1/completions 200")
        assert "cost=7" in line, line


async def test_an_override_the_config_does_not_list_is_ignored(tmp_path: pathlib.Path) -> None:
    """allowed_override_modes without the EPP's mode: Envoy ignores the override (no error), sends
    the response as configured, and the EPP answers it: requests still succeed."""
    other = [
        {
            "request_body_mode": "BUFFERED",
            "request_trailer_mode": "SKIP",
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        }
    ]
    async with make_stack(tmp_path, envoy=lean_envoy(allowed_override_modes=other)) as s:
        assert await messages_per_request(s, STREAMED) > 3


async def test_gie_full_duplex_config_sends_every_response_chunk(tmp_path: pathlib.Path) -> None:
    """FULL_DUPLEX_STREAMED (GIE): Envoy would ignore any override, so all phases reach the EPP."""
    mode = shipped_ext_proc("gie.yaml")["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    async with make_stack(tmp_path) as s:
        assert await messages_per_request(s, STREAMED) > 4  # headers, body chunks (Envoy coalesces some)


@pytest.mark.slow
@pytest.mark.parametrize("config", [None, "request-attribute-reporter.yaml"], ids=["skipped", "streamed"])
async def test_fail_open_config_skips_the_response_and_still_fails_open(
    tmp_path: pathlib.Path, config: str | None
) -> None:
    """fail-open.yaml's modes: the EPP skips the response when no plugin reads it, and requests go
    on round robin while the EPP is gone, whether their responses were skipped or STREAMED to it."""
    from tests.e2e.test_fail_open import REQUESTS, run_through_an_epp_stop

    envoy = {**lean_envoy("fail-open.yaml"), "fallback_to_fleet": True}
    text = None if config is None else (EXAMPLES / config).read_text()
    async with make_stack(tmp_path, config=text, epp_args=["--shutdown-delay=0s"], envoy=envoy) as s:
        per_request = await messages_per_request(s, STREAMED, n=2)
        assert per_request == 2 if config is None else per_request > 3
        statuses = await run_through_an_epp_stop(s)
    assert statuses == Counter({200: REQUESTS})


async def test_an_explained_request_gets_its_response_headers_under_the_lean_config(
    tmp_path: pathlib.Path,
) -> None:
    """The second mode lean.yaml lists: response headers SEND, body NONE, for a request that asked
    for an explanation; the next request, unexplained, skips the response entirely."""
    from epp.explain.record import SCORES_HEADER

    explain = "x-epp-explain"
    async with make_stack(
        tmp_path, envoy=lean_envoy(), epp_args=[f"--explain-request-header={explain}"]
    ) as s:
        before = (await s.envoy.stats())[SENT]
        r = await s.post("/v1/completions", STREAMED, headers={explain: "yes"})
        assert r.status == 200 and SCORES_HEADER in r.headers
        explained = (await s.envoy.stats())[SENT] - before
        assert explained == 3  # request headers, body, response headers: no response chunk
        r = await s.post("/v1/completions", STREAMED)
        assert r.status == 200 and SCORES_HEADER not in r.headers
        assert (await s.envoy.stats())[SENT] - before - explained == 2
