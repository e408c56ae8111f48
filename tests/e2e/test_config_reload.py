"""Live config reload through Envoy: rewriting the config file while requests flow changes where
they go, and none of them fails.  Also: a broken file is rejected while the old config serves."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import time
from collections import Counter

import pytest

from tests.e2e.conftest import Stack, make_stack, open_loop

pytestmark = pytest.mark.e2e

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
PROMPT = "Summarise the plot of a long novel about a lighthouse keeper. " * 8


def pinned_by_prefix(prefix_weight: float) -> str:
    """With a heavy prefix-cache weight every request with one prompt goes where the first went;
    at weight 0 the queue scorer spreads them (ties are broken at random)."""
    return (
        HEAD
        + f"""plugins:
- type: queue-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: {prefix_weight}
  - pluginRef: queue-scorer
    weight: 1
"""
    )


def random_picker() -> str:
    """The pinning config with the picker swapped: a random picker ignores the scores."""
    return (
        pinned_by_prefix(100).replace(
            "- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n- type: random-picker\n"
        )
        + "  - pluginRef: random-picker\n"
    )


def rewrite(path: pathlib.Path, text: str) -> None:
    """Like an editor (or kubelet's ConfigMap update): a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


async def generation(stack: Stack) -> int:
    m = re.search(
        r'^inference_extension_config_generation\{hash="\w+"\} (\S+)$', await stack.epp_metrics(), re.M
    )
    return int(float(m.group(1))) if m else 0


async def reloads(stack: Stack, result: str) -> float:
    pattern = rf'^inference_extension_config_reload_total\{{result="{result}"\}} (\S+)$'
    m = re.search(pattern, await stack.epp_metrics(), re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize(
    "after", [pytest.param(pinned_by_prefix(0), id="weight"), pytest.param(random_picker(), id="picker")]
)
async def test_a_config_change_reroutes_live_without_failing_a_request(
    tmp_path: pathlib.Path, after: str
) -> None:
    async with make_stack(tmp_path, config=pinned_by_prefix(100)) as stack:
        body = {"model": "mock-model", "prompt": PROMPT, "max_tokens": 2}
        first = await stack.post("/v1/completions", body)
        assert first.status == 200
        pinned = first.served_by
        results: list[tuple[float, int, str]] = []  # (sent, status, served by)
        written = 0.0

        async def send(i: int) -> None:
            sent = time.monotonic()
            reply = await stack.post("/v1/completions", body)
            results.append((sent, reply.status, reply.served_by))

        async def change_midway() -> None:
            nonlocal written
            await asyncio.sleep(1.5)
            rewrite(tmp_path / "config.yaml", after)
            written = time.monotonic()

        await asyncio.gather(open_loop(send, rate=60, seconds=5.0), change_midway())

        assert [r for r in results if r[1] != 200] == []
        before = Counter(by for sent, _, by in results if sent < written)
        assert set(before) == {pinned}, before
        assert await generation(stack) == 2
        late = Counter(by for sent, _, by in results if sent > written + 2.0)  # reloaded within 2 s
        assert len(late) >= 2, late  # spread over the fleet now
        assert late[pinned] < sum(late.values())


async def test_a_broken_file_is_rejected_and_the_old_config_keeps_serving(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, config=pinned_by_prefix(100)) as stack:
        body = {"model": "mock-model", "prompt": PROMPT, "max_tokens": 2}
        pinned = (await stack.post("/v1/completions", body)).served_by
        rewrite(tmp_path / "config.yaml", pinned_by_prefix(100).replace("weight: 1\n", "weight: -1\n"))
        async with asyncio.timeout(10):
            while True:
                if await reloads(stack, "failure") >= 1:
                    break
                await asyncio.sleep(0.05)  # poll interval against another process
        replies = [await stack.post("/v1/completions", body) for _ in range(10)]
        assert {r.status for r in replies} == {200}
        assert {r.served_by for r in replies} == {pinned}
        assert await generation(stack) == 1
        assert "schedulingProfiles[0].plugins[1].weight" in stack.epp.log_tail()
