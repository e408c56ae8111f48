"""The overhead paths through a real Envoy: direct, Envoy alone and the no-op ext_proc floors."""

from __future__ import annotations

import pytest

from bench.httpload import post
from bench.paths import DIRECT, ENVOY, FLOOR, FLOOR_H2, Lab, extproc_messages

pytestmark = pytest.mark.e2e


async def test_paths_answer_and_count_extproc_messages() -> None:
    """Each path returns the upstream's answer; only the floors' Envoys talk to an ext_proc server
    (on grpc.aio, and on the EPP's own h2 transport)."""
    body = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}'
    async with Lab([DIRECT, ENVOY, FLOOR, FLOOR_H2], upstreams=2, idle_window_s=0.2) as lab:
        for name, path in lab.paths.items():
            r = await path.client().send(post("/v1/chat/completions", body), timeout=10)
            assert (name, r.status, r.events) == (name, 200, 6)
        assert await extproc_messages(lab.paths["envoy"]) == {}
        for name in ("floor", "floor-h2"):
            floor = await extproc_messages(lab.paths[name])
            # request headers, body, response headers, >= 1 response body chunk (+ trailers if any)
            assert floor["streams_started"] == 1
            assert floor["stream_msgs_sent"] >= 4
            assert set(lab.paths[name].pids) == {"envoy", "extproc"}
