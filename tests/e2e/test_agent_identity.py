"""agent-identity through Envoy: the llm-d agentic-serving guide's config, unchanged, queues each
agent session under its own fairness id in flow control (read back from the EPP's /metrics)."""

from __future__ import annotations

import pathlib
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GUIDE = (
    pathlib.Path(__file__).resolve().parents[1] / "config" / "corpus" / "llmd-guides--agentic-serving.yaml"
)
QUEUED = "inference_extension_flow_control_request_queue_duration_seconds"


def dispatched_by_fairness_id(metrics: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics):
        if family.name == QUEUED:
            for sample in family.samples:
                if sample.name == QUEUED + "_count" and sample.labels["outcome"] == "Dispatched":
                    counts[sample.labels["fairness_id"]] += int(sample.value)
    return counts


async def test_agent_sessions_get_their_own_fairness_flows(tmp_path: pathlib.Path) -> None:
    sends: tuple[dict[str, str], ...] = (
        {"x-claude-code-session-id": "claude-1"},  # Claude Code
        {"x-claude-code-session-id": "claude-1"},  # its next turn: the same flow
        {"x-session-affinity": "opencode-1"},  # OpenCode
        {"session-id": "codex-1"},  # Codex
        {"x-gateway-inference-fairness-id": "tenant-x", "session-id": "codex-1"},  # explicit wins
        {},  # no agent: the shared default flow
    )
    async with make_stack(tmp_path, replicas=2, config=GUIDE.read_text()) as s:
        for headers in sends:
            r = await s.post(
                "/v1/completions", {"model": "mock-model", "prompt": "hi", "max_tokens": 2}, headers
            )
            assert r.status == 200 and r.epp_choice == r.served_by
        counts = dispatched_by_fairness_id(await s.epp_metrics())
    assert counts == {"claude-1": 2, "opencode-1": 1, "codex-1": 1, "tenant-x": 1, "default-flow": 1}
