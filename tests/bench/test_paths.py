"""The overhead paths through a real Envoy: direct, Envoy alone and the no-op ext_proc floor."""

from __future__ import annotations

import pytest

from bench.httpload import post
from bench.paths import DIRECT, ENVOY, FLOOR, Lab, extproc_messages

pytestmark = pytest.mark.e2e


async def test_paths_answer_and_count_extproc_messages() -> None:
    """Each path returns the upstream's answer; only the floor's Envoy talks to an ext_proc server."""
    body = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}'
    async with Lab([DIRECT, ENVOY, FLOOR], upstreams=2, idle_window_s=0.2) as lab:
        for name, path in lab.paths.items():
            r = await path.client().send(post("/v1/chat/completions", body), timeout=10)
            assert (name, r.status, r.events) == (name, 200, 6)
        assert await extproc_messages(lab.paths["envoy"]) == {}
        floor = await extproc_messages(lab.paths["floor"])
        # request headers, body, response headers, >= 1 response body chunk (+ trailers if any)
        assert floor["streams_started"] == 1
        assert floor["stream_msgs_sent"] >= 4
        assert set(lab.paths["floor"].pids) == {"envoy", "extproc"}
