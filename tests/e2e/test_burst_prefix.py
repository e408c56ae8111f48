"""burst-prefix-cache-producer end to end: llm-d-router's sample pipeline through Envoy and the simulator.

The sample config (tests/config/corpus/llmd-router-v0.10.0--epp-burst-prefix-cache-config.yaml)
without its token-producer, whose URL is a placeholder: the producer then hashes the prompt
text, as upstream's estimate backend does.  Two RL-style rollout groups arrive at once on a cold
pool; each group's samples must share one replica, and the two groups must not share one.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from tests.e2e.conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: single-profile-handler
  - type: decode-filter
  - type: burst-prefix-cache-producer
    parameters:
      windowDurationMs: 100
      maxPerReplica: -1
      minColocateBlocks: 0
  - type: prefix-cache-scorer
    parameters:
      prefixMatchInfoProducerName: burst-prefix-cache-producer
  - type: load-aware-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: decode-filter
      - pluginRef: prefix-cache-scorer
        weight: 2.0
      - pluginRef: load-aware-scorer
        weight: 1.0
      - pluginRef: max-score-picker
"""


async def test_rollout_groups_colocate_per_prompt(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=4, config=CONFIG) as s:
        prompts = {g: f"Rollout group {g}: solve the following problem step by step. " * 30 for g in "AB"}

        async def sample(g: str) -> str:
            r = await s.post(
                "/v1/completions", {"model": "mock-model", "prompt": prompts[g], "max_tokens": 4}
            )
            assert r.status == 200 and r.epp_choice == r.served_by
            return r.served_by

        replies = await asyncio.gather(*(sample(g) for g in "AAAAAABBBBBB"))
        a, b = set(replies[:6]), set(replies[6:])
        assert len(a) == 1 and len(b) == 1, replies
        assert a != b, replies  # the second group goes to a less loaded replica of the window
