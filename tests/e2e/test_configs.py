"""Issue 4 end to end: the default config and GIE's example configs route real requests through Envoy."""

from __future__ import annotations

import pathlib
from collections import Counter

import pytest

from tests.e2e.conftest import FAST_SIM, Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"
MODEL = "mock-model"


def chat(system: str, question: str, **extra: object) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}


async def test_default_config_keeps_a_shared_prefix_on_one_replica(stack: Stack) -> None:
    """GIE's default profile (queue 2, kv 2, prefix 3): requests sharing a long system prompt stick
    to the replica that already holds it, while a different prefix may go elsewhere."""
    system_a = "You are assistant A. " + "Policy text for tenant A. " * 200
    first = await stack.post("/v1/chat/completions", chat(system_a, "question 0"))
    assert first.status == 200
    followers = [
        await stack.post("/v1/chat/completions", chat(system_a, f"question {i}")) for i in range(1, 7)
    ]
    assert {r.served_by for r in followers} == {first.served_by}
    metrics = await stack.epp_metrics()
    assert "inference_extension_prefix_indexer_hit_ratio_bucket" in metrics


@pytest.mark.parametrize(
    "name",
    [
        "helm-default",
        "integration-default",
        "flow-control",
        "prefix-and-load",
        "predicted-latency",
        "predicted-latency-mixed-slo",
    ],
)
async def test_example_config_routes(tmp_path: pathlib.Path, name: str) -> None:
    """GIE's Helm default, integration-test config and the flow-control example all serve traffic."""
    config = (EXAMPLES / f"{name}.yaml").read_text()
    async with make_stack(tmp_path, config=config) as s:
        replies = [
            await s.post("/v1/completions", {"model": MODEL, "prompt": f"p{i}", "max_tokens": 2})
            for i in range(6)
        ]
        assert all(r.status == 200 and r.epp_choice == r.served_by for r in replies), [
            r.status for r in replies
        ]


async def test_conformance_config_follows_the_test_header(tmp_path: pathlib.Path) -> None:
    """The conformance profile routes strictly by test-epp-endpoint-selection; no header means no endpoint."""
    config = (EXAMPLES / "conformance.yaml").read_text()
    async with make_stack(tmp_path, config=config) as s:
        target = s.fleet.hostports[2]
        for _ in range(4):
            r = await s.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1},
                             headers={"test-epp-endpoint-selection": target})  # fmt: skip
            assert r.status == 200 and r.served_by == target
        two = ",".join(s.fleet.hostports[:2])
        seen: Counter[str] = Counter()
        for _ in range(24):
            r = await s.post("/v1/completions", {"model": MODEL, "prompt": "y", "max_tokens": 1},
                             headers={"test-epp-endpoint-selection": two})  # fmt: skip
            seen[r.served_by] += 1
        assert set(seen) <= set(s.fleet.hostports[:2]) and len(seen) == 2  # max-score ties break at random
        r = await s.post("/v1/completions", {"model": MODEL, "prompt": "z", "max_tokens": 1})
        assert r.status == 429 and b"failed to find target endpoint" in r.body


async def test_request_attribute_reporter_sets_dynamic_metadata(tmp_path: pathlib.Path) -> None:
    """The reporter's CEL expression (usage.completion_tokens) lands in envoy.lb metadata, as Envoy logs it."""
    config = (EXAMPLES / "request-attribute-reporter.yaml").read_text()
    async with make_stack(tmp_path, config=config, sim_args=FAST_SIM) as s:
        r = await s.post(
            "/v1/completions", {"model": MODEL, "prompt": "bill me", "max_tokens": 7, "ignore_eos": True}
        )
        assert r.status == 200
        line = await s.access_log_line("POST /v1/completions 200")
        assert "cost=7" in line, line
