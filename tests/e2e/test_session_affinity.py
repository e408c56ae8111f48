"""Session affinity through a real Envoy: a conversation's turns land on one replica, and after
that replica is gone they move once and stick to the new one."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from tests.e2e.conftest import FAST_SIM, Reply, Stack, make_stack

pytestmark = pytest.mark.e2e

SIM = (*FAST_SIM, "--enable-prompt-tokens-details")  # usage.prompt_tokens_details.cached_tokens
# Nothing but the filter keeps a conversation together: without it the random picker spreads turns.
CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig: {sources: [{header: x-session-token}]}
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: session-affinity-filter}
  - {pluginRef: random-picker}
"""

ENCODED = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: session-affinity-scorer, weight: 10}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""


class Conversation:
    """A chat that grows by one user and one assistant message per turn."""

    def __init__(self, stack: Stack, session: str) -> None:
        self.stack = stack
        self.session = session
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse. " * 40}]

    async def turn(self, i: int, headers: dict[str, str] | None = None) -> Reply:
        msgs = [*self.messages, {"role": "user", "content": f"question {i} of {self.session} " * 20}]
        body = {"model": "mock-model", "messages": msgs, "max_tokens": 8}
        reply = await self.stack.post("/v1/chat/completions", body, headers=headers)
        if reply.status == 200:
            answer = reply.json()["choices"][0]["message"]["content"]
            self.messages = [*msgs, {"role": "assistant", "content": answer}]
        return reply


def cached(reply: Reply) -> int:
    details = reply.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def test_turns_stick_to_one_replica_and_move_once_it_is_gone(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=3, sim_args=SIM, config=CONFIG) as s:
        convs = [Conversation(s, f"conv-{k}") for k in range(3)]
        homes: dict[str, set[str]] = {c.session: set() for c in convs}
        for i in range(4):
            for c in convs:
                r = await c.turn(i, {"x-session-token": c.session})
                assert r.status == 200
                homes[c.session].add(r.served_by)
                if i > 0:
                    assert cached(r) > 0, "a follow-up turn found no cached context"
        assert all(len(h) == 1 for h in homes.values()), homes
        victim = convs[0]
        home = next(iter(homes[victim.session]))
        await s.sim_faults(s.fleet.hostports.index(home), crashed=True)

        # The EPP notices the crash through its scrapes (passive health); until then a turn may
        # fail.  Each attempt is a request round trip, bounded in number.
        moved = None
        for attempt in range(200):
            r = await victim.turn(10 + attempt, {"x-session-token": victim.session})
            if r.status == 200:
                moved = r
                break
        assert moved is not None, "the session never moved off the crashed replica"
        new_home = moved.served_by
        assert new_home != home
        for i in range(3):
            r = await victim.turn(20 + i, {"x-session-token": victim.session})
            assert r.status == 200
            assert r.served_by == new_home
            assert cached(r) > 0


async def test_encoded_endpoint_header_token_is_echoed_back(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=3, sim_args=SIM, config=ENCODED) as s:
        conv = Conversation(s, "echo")
        first = await conv.turn(0)
        token = first.headers.get("x-session-token", "")
        assert token, f"no session token on the response: {first.headers}"
        for i in range(1, 5):
            r = await conv.turn(i, {"x-session-token": token})
            assert r.status == 200
            assert r.served_by == first.served_by
            token = r.headers["x-session-token"]
