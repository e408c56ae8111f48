"""Several parsers (llm-d-router's ``requestHandler.parsers``) through Envoy: each path its parser."""

from __future__ import annotations

import pathlib

import pytest

from tests.e2e.conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mock-model"
CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: openai-parser
- type: anthropic-parser
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: anthropic-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


async def test_each_path_goes_to_its_parser_and_an_unclaimed_one_is_400(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, config=CONFIG) as s:
        r = await s.post(
            "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status == 200 and r.epp_choice == r.served_by
        # No max_tokens: anthropic-parser takes it (openai-parser, reading /v1/messages too, would refuse it).
        r = await s.post("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.epp_choice == r.served_by  # routed: the EPP accepted it, whatever the replica answers
        r = await s.post("/v1/unclaimed", {"model": MODEL, "prompt": "hi"})
        assert r.status == 400
        assert b"no parser registered matching path suffix for: /v1/unclaimed" in r.body
