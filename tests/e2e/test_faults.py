"""Model-server faults under load through a real Envoy: a replica crashed, hung, failing with 500s,
or with a /metrics that never answers.  Whatever one replica does, the others keep serving."""

from __future__ import annotations

import asyncio
import pathlib
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.e2e.conftest import Stack, make_stack, open_loop

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 50.0  # requests per second, open loop


@dataclass
class Outcome:
    sent_at: float
    status: int  # -1: the client gave up or the connection failed
    replica: str


@dataclass
class OpenLoop:
    """Requests at ``RATE``/s regardless of how fast they finish (a stuck replica cannot slow it)."""

    stack: Stack
    timeout: float = 5.0
    outcomes: list[Outcome] = field(default_factory=list)

    async def _one(self, i: int, stream: bool) -> None:
        t = time.monotonic()
        body = {"model": "mock-model", "prompt": f"fault {i}", "max_tokens": 3, "stream": stream}
        try:
            async with asyncio.timeout(self.timeout):
                async with self.stack.http.post(self.stack.url + "/v1/completions", json=body) as r:
                    await r.read()
                    self.outcomes.append(Outcome(t, r.status, r.headers.get("x-inference-port", "")))
        except (TimeoutError, aiohttp.ClientError):
            self.outcomes.append(Outcome(t, -1, ""))

    async def run(self, seconds: float) -> None:
        await open_loop(lambda i: self._one(i, stream=i % 2 == 1), RATE, seconds)

    def after(self, t: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.sent_at >= t]


def port_of(s: Stack, replica: int) -> str:
    return str(s.fleet.ports[replica])


@pytest.mark.parametrize(
    ("fault", "grace"),
    [
        pytest.param({"crashed": True}, 0.5, id="crashed"),
        pytest.param({"error_rate": 1.0}, 0.5, id="answers-500"),
        pytest.param({"paused": True}, 1.0, id="hangs"),
    ],
)
async def test_faulty_replica_stops_being_picked(
    tmp_path: pathlib.Path, fault: dict[str, object], grace: float
) -> None:
    async with make_stack(tmp_path, replicas=3) as s:
        load = OpenLoop(s, timeout=3.0)
        run = asyncio.create_task(load.run(5.0))
        await asyncio.sleep(1.0)  # steady load before the fault (part of the scenario, not a sync)
        t_fault = time.monotonic()
        await s.sim_faults(0, **fault)
        await run
        bad = port_of(s, 0)
        settled = load.after(t_fault + grace)
        picked = [o for o in settled if o.replica == bad]
        failed = [o for o in settled if o.status != 200]
        assert len(settled) > 100
        assert not picked, f"{len(picked)} requests still served by the faulty replica"
        assert len(failed) <= max(1, int(0.005 * len(settled))), f"{len(failed)} of {len(settled)} failed"


async def test_metrics_timeout_never_stalls_routing(tmp_path: pathlib.Path) -> None:
    """One replica's /metrics hangs for 30 s: routing latency and success are unaffected."""
    async with make_stack(tmp_path, replicas=3) as s:
        await s.sim_faults(0, metrics_delay_s=30.0)
        load = OpenLoop(s, timeout=3.0)
        await load.run(3.0)
        ok = [o for o in load.outcomes if o.status == 200]
        assert len(ok) == len(load.outcomes) > 100
