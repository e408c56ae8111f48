"""Fail-open: what happens to client requests when the EPP goes away mid-run (GIE issue #1266)."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import time
from collections import Counter

import pytest

from tests.e2e.conftest import Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REQUESTS = 60
STOP_AFTER = 20


async def run_through_an_epp_stop(s: Stack) -> Counter[int]:
    """Send requests at ~100/s; after STOP_AFTER of them, SIGTERM the EPP. Count the statuses."""
    statuses: Counter[int] = Counter()

    async def one(i: int) -> None:
        try:
            r = await s.post(
                "/v1/completions", {"model": "mock-model", "prompt": f"request {i}", "max_tokens": 2}
            )
            statuses[r.status] += 1
        except Exception:
            statuses[-1] += 1

    tasks = []
    for i in range(REQUESTS):
        tasks.append(asyncio.create_task(one(i)))
        if i == STOP_AFTER:
            await s.epp.signal(signal.SIGTERM)
        await asyncio.sleep(0.01)  # pacing: requests spread over the shutdown
    await asyncio.gather(*tasks)
    assert await s.epp.wait(30) == 0  # the EPP drained and exited cleanly
    return statuses


@pytest.mark.parametrize(
    ("body_mode", "lost"),
    [
        pytest.param("BUFFERED", False, id="buffered-fails-open"),
        pytest.param("FULL_DUPLEX_STREAMED", True, id="full-duplex-does-not"),
    ],
)
async def test_epp_stop_mid_run(tmp_path: pathlib.Path, body_mode: str, lost: bool) -> None:
    """With BUFFERED bodies Envoy falls back to round robin once the EPP is gone and no request is
    lost; with FULL_DUPLEX_STREAMED (GIE's mode) Envoy 1.40 does not fail open (issue #1266)."""
    async with make_stack(
        tmp_path,
        epp_args=["--shutdown-delay=0s"],  # the port closes at once: what Envoy does when the EPP is gone
        envoy={
            "failure_mode_allow": True,
            "request_body_mode": body_mode,
            "buffer_limit_bytes": 1 << 20,
            "fallback_to_fleet": True,
        },
    ) as s:
        statuses = await run_through_an_epp_stop(s)
    if lost:
        assert statuses[200] >= STOP_AFTER - 2  # served while the EPP was up
        assert statuses[200] < REQUESTS  # then Envoy stops serving: no fail-open in this mode
    else:
        assert statuses == Counter({200: REQUESTS})


async def test_sigterm_drains_an_in_flight_stream(tmp_path: pathlib.Path) -> None:
    """SIGTERM while a response is streaming: the EPP stops taking new streams, lets the in-flight
    one finish within the grace period, and exits 0; the client gets every token."""
    slow = ("--time-scale", "1.0", "--decode-ms-per-seq", "40", "--seed", "5")
    drain = ["--shutdown-delay=5s", "--shutdown-grace-period=20s"]  # the default delay: its quiet gap
    async with make_stack(tmp_path, replicas=1, sim_args=slow, epp_args=drain) as s:
        body = {"model": "mock-model", "prompt": "drain me", "max_tokens": 24, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with s.http.post(s.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            first = await r.content.readline()
            assert first.startswith(b"data: ")
            await s.epp.signal(signal.SIGTERM)  # mid-stream
            rest = await r.read()
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert b'"completion_tokens":24' in rest
        assert await s.epp.wait(30) == 0


FAIL_OPEN_ENVOY = {
    "failure_mode_allow": True,
    "request_body_mode": "BUFFERED",
    "buffer_limit_bytes": 1 << 20,
    "fallback_to_fleet": True,
}


async def test_epp_sigkill_under_load_loses_nothing_with_the_fail_open_config(tmp_path: pathlib.Path) -> None:
    """~50 req/s, half streamed; the EPP is SIGKILLed, then restarted on the same ports. With the
    fail-open config every request succeeds (round robin while the EPP is away), and requests
    carry the EPP's routing again within 2 s of it being back."""
    async with make_stack(tmp_path, envoy=FAIL_OPEN_ENVOY) as s:
        results: list[tuple[float, int, bool]] = []  # (sent at, status, routed by the EPP)

        async def one(i: int) -> None:
            t = time.monotonic()
            body = {"model": "mock-model", "prompt": f"k {i}", "max_tokens": 3, "stream": i % 2 == 0}
            try:
                async with s.http.post(s.url + "/v1/completions", json=body) as r:
                    data = await r.read()
                    complete = not body["stream"] or data.rstrip().endswith(b"[DONE]")
                    results.append(
                        (t, r.status if complete else -2, bool(r.headers.get("x-epp-destination")))
                    )
            except Exception:
                results.append((t, -1, False))

        tasks: list[asyncio.Task[None]] = []

        async def load(seconds: float) -> None:
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                tasks.append(asyncio.create_task(one(len(tasks))))
                await asyncio.sleep(0.02)  # pacing: the load's request rate

        await load(1.0)
        await s.epp.signal(signal.SIGKILL)
        await s.epp.wait(10)
        await load(1.5)
        await s.epp.start()  # same ports; returns once its health says SERVING
        back = time.monotonic()
        await load(3.0)
        await asyncio.gather(*tasks)
    assert Counter(status for _, status, _ in results) == Counter({200: len(results)})
    routed_again = [t for t, _, routed in results if t >= back and routed]
    assert routed_again and routed_again[0] - back < 2.0
    assert all(routed for t, _, routed in results if t >= back + 2.0)
