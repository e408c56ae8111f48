"""What the director tells endpoint health: each routed request, its response status, its first
bytes, and a stream that ends without response headers; and that routing then honours it."""

from __future__ import annotations

from epp.health import Status
from tests.director.test_director import body, director

SSE = {":status": "200", "content-type": "text/event-stream"}


async def test_a_5xx_streak_ejects_the_endpoint_and_routing_moves_on() -> None:
    d, _ = director()
    first = None
    for _ in range(3):
        lc = d.start({}, {})
        await lc.route(body("h-5xx"))
        target = lc.ctx.target
        assert target is not None and (first is None or target is first)
        first = target
        lc.response_headers({":status": "500"}, end_of_stream=True)
        lc.close()
    assert first is not None
    assert (first.health.status, first.health.reason) == (Status.EJECTED, "consecutive-5xx")
    lc = d.start({}, {})
    await lc.route(body("h-5xx"))
    assert lc.ctx.target is not None and lc.ctx.target is not first
    lc.close()


async def test_a_request_is_awaited_until_headers_or_its_end() -> None:
    d, _ = director()
    lc = d.start({}, {})
    await lc.route(body("h-await"))
    target = lc.ctx.target
    assert target is not None and target.health.awaiting == 1 and target.health.waiting_since > 0
    lc.close()  # the stream ended before any response headers
    assert target.health.awaiting == 0 and target.health.waiting_since == 0.0
    lc = d.start({}, {})
    await lc.route(body("h-await"))
    lc.response_headers(dict(SSE), end_of_stream=False)
    assert target.health.awaiting == 0 and target.health.headers_usual > 0


async def test_a_streamed_first_chunk_is_a_time_to_first_token_sample() -> None:
    d, _ = director()
    lc = d.start({}, {})
    await lc.route(body("h-ttft"))
    target = lc.ctx.target
    assert target is not None
    lc.response_headers(dict(SSE), end_of_stream=False)
    assert target.health.latency_samples == 0
    lc.response_chunk(b"data: {}\n\n", False)
    lc.response_chunk(b"data: {}\n\n", False)
    assert target.health.latency_samples == 1 and target.health.latency_usual > 0
    lc.response_chunk(b"data: [DONE]\n\n", True)
    lc.close()
