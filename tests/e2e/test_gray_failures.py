"""Gray failures through a real Envoy: a replica that hangs (SIGSTOP), whose inference path hangs
while /metrics answers, that slows down 10x, or that is merely busy.  Each replica is its own
``epp-sim`` process, so one can be stopped with SIGSTOP as a hung process would be.

The EPP runs GIE's default scorers plus ``endpoint-health-scorer`` (the penalty); thresholds are
the health policy's defaults (docs/health.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.e2e.conftest import QUICK_STOP, open_loop

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 50.0  # requests per second, open loop
SIM = ("--seed", "7", "--max-model-len", "131072")
FAST = ("--time-scale", "0.02")
CONFIG = pathlib.Path(__file__).resolve().parents[2] / "config" / "examples" / "endpoint-health.yaml"


@dataclass
class Outcome:
    sent_at: float
    status: int  # -1: the client gave up or the connection failed
    port: str  # the replica that answered ("" when none did)
    ttft: float = 0.0  # seconds to the first body chunk


@dataclass
class Gray:
    """One-process-per-replica stack: the sims, the EPP, Envoy, and an open-loop load."""

    sims: list[SimFleet]
    epp: EppProcess
    envoy: Envoy
    http: aiohttp.ClientSession
    outcomes: list[Outcome] = field(default_factory=list)

    def port(self, replica: int) -> str:
        return str(self.sims[replica].ports[0])

    async def fault(self, replica: int, **faults: Any) -> None:
        async with self.http.post(f"http://127.0.0.1:{self.port(replica)}/sim/faults", json=faults) as r:
            assert r.status == 200, await r.text()

    async def _one(self, i: int, timeout: float) -> None:
        t = time.monotonic()
        body = {"model": "mock-model", "prompt": f"gray {i}", "max_tokens": 3, "stream": True}
        try:
            async with asyncio.timeout(timeout):
                async with self.http.post(self.envoy.url + "/v1/completions", json=body) as r:
                    first = 0.0
                    async for _ in r.content.iter_any():
                        first = first or time.monotonic() - t
                    self.outcomes.append(Outcome(t, r.status, r.headers.get("x-inference-port", ""), first))
        except (TimeoutError, aiohttp.ClientError):
            self.outcomes.append(Outcome(t, -1, ""))

    async def load(self, seconds: float, timeout: float = 2.0) -> None:
        await open_loop(lambda i: self._one(i, timeout), RATE, seconds)

    def between(self, t0: float, t1: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if t0 <= o.sent_at < t1]

    async def transitions(self) -> dict[tuple[str, str], float]:
        """``epp_endpoint_health_transitions_total`` by (state, reason), summed over endpoints."""
        async with self.http.get(f"http://127.0.0.1:{self.epp.metrics_port}/metrics") as r:
            text = await r.text()
        out: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            if line.startswith("epp_endpoint_health_transitions_total{"):
                labels, value = line[line.index("{") + 1 : line.rindex("}")], line.rsplit(" ", 1)[1]
                kv = dict(p.split("=", 1) for p in labels.split(","))
                key = (kv["state"].strip('"'), kv["reason"].strip('"'))
                out[key] = out.get(key, 0.0) + float(value)
        return out

    async def health(self) -> dict[str, Any]:
        """The health scorer's ``/debug/plugins/state``: every endpoint's health by name."""
        async with self.http.get(f"http://127.0.0.1:{self.epp.metrics_port}/debug/plugins/state") as r:
            state = orjson.loads(await r.read())
        result: dict[str, Any] = state["plugins"]["endpoint-health-scorer"]["endpoints"]
        return result


@contextlib.asynccontextmanager
async def gray_stack(replicas: int = 3, sim: tuple[str, ...] = FAST) -> AsyncIterator[Gray]:
    async with contextlib.AsyncExitStack() as stack:
        sims = list(  # started side by side
            await asyncio.gather(
                *(stack.enter_async_context(SimFleet(1, *SIM, *sim)) for _ in range(replicas))
            )
        )
        hostports = ",".join(s.hostports[0] for s in sims)
        epp = await stack.enter_async_context(
            EppProcess(
                f"--endpoints={hostports}", f"--config-file={CONFIG}", "--bind-address=127.0.0.1", QUICK_STOP
            )
        )
        proxy = await stack.enter_async_context(Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        gray = Gray(sims, epp, proxy, http)
        try:
            yield gray
        except BaseException:
            print("---- epp log ----\n", epp.log_tail())
            raise
        finally:
            for s in sims:  # a stopped replica must be resumed to be stopped
                await s.signal(signal.SIGCONT)


async def _fault_under_load(
    g: Gray, seconds: float, at: float, inject: Callable[[], Any], timeout: float = 2.0
) -> float:
    """Run the load for ``seconds``; call ``inject`` ``at`` seconds in; the fault's time."""
    run = asyncio.create_task(g.load(seconds, timeout))
    await asyncio.sleep(at)  # steady load before the fault (part of the scenario, not a sync)
    t_fault = time.monotonic()
    await inject()
    await run
    return t_fault


def _judged(h: dict[str, Any]) -> tuple[Any, ...]:
    """An endpoint's verdict and the figures it was judged on (``/debug/plugins/state``)."""
    keys = ("status", "reason", "ttftPerQueueMs", "peersTtftPerQueueMs", "load", "peersLoad")
    return tuple(h.get(k) for k in keys)


def failed(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status != 200]


async def test_hung_replica_gets_no_new_request_within_300ms() -> None:
    """SIGSTOP: the port accepts, nothing answers.  Requests sent 300 ms after all succeed."""
    async with gray_stack() as g:
        t_fault = await _fault_under_load(g, 3.5, 1.0, lambda: g.sims[0].signal(signal.SIGSTOP))
        after = g.between(t_fault + 0.3, t_fault + 2.5)  # those sent late enough to finish in time
        assert len(after) > 80
        bad = failed(after)
        assert len(bad) <= max(1, int(0.005 * len(after))), f"{len(bad)} of {len(after)} failed"
        moves = await g.transitions()
        assert moves.get(("ejected", "scrape-hang"), 0) >= 1, moves
        health = await g.health()
        assert sum(h["status"] == "ejected" for h in health.values()) == 1, health


async def test_inference_only_hang_is_routed_around() -> None:
    """/metrics answers, inference never does: ejected once requests wait far longer than peers'."""
    async with gray_stack() as g:
        t_fault = await _fault_under_load(g, 3.5, 1.0, lambda: g.fault(0, inference_stall=True))
        after = g.between(t_fault + 1.0, t_fault + 2.5)
        assert len(after) > 50
        bad = failed(after)
        assert len(bad) <= max(1, int(0.005 * len(after))), f"{len(bad)} of {len(after)} failed"
        moves = await g.transitions()
        assert moves.get(("ejected", "no-response-headers"), 0) >= 1, moves
        await g.fault(0, inference_stall=False)


async def test_slow_replica_is_penalised_within_1s_and_recovers() -> None:
    """10x slower at the same load: it loses its share within 1 s, and gets it back after healing."""
    async with gray_stack(sim=("--time-scale", "1.0")) as g:
        slow = g.port(0)

        async def slow_then_heal() -> None:
            await g.fault(0, slowdown=10.0)
            await asyncio.sleep(2.0)  # the fault lasts two seconds (scenario time, not a sync)
            await g.fault(0, slowdown=1.0)

        t_fault = await _fault_under_load(g, 9.0, 1.5, slow_then_heal)
        before = g.between(t_fault - 1.0, t_fault)
        during = g.between(t_fault + 1.0, t_fault + 2.0)
        healed = g.between(t_fault + 6.0, t_fault + 7.5)

        def share(os: list[Outcome]) -> float:
            return sum(o.port == slow for o in os) / max(1, len(os))

        assert share(before) > 0.15, f"it served {share(before):.0%} before the fault"
        assert share(during) < 0.05, f"still {share(during):.0%} of requests while slow"
        assert share(healed) > 0.15, f"only {share(healed):.0%} after healing"
        assert not failed(g.outcomes)
        moves = await g.transitions()
        assert moves.get(("degraded", "latency-outlier"), 0) >= 1, moves
        assert not any(state == "ejected" for state, _ in moves), moves


async def test_busy_replica_is_not_ejected() -> None:
    """A replica saturated by traffic from elsewhere answers slowly, scrapes included: no ejection,
    no penalty, no failed request."""
    async with gray_stack(sim=("--time-scale", "1.0")) as g:
        busy_url = f"http://127.0.0.1:{g.port(0)}/v1/completions"
        # The hogs' own connections: the load's session must not wait for a free one.
        hog_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def hog(i: int) -> None:
            body = {"model": "mock-model", "prompt": f"hog {i} " * 50, "max_tokens": 300, "ignore_eos": True}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(20), hog_http.post(busy_url, json=body) as r:
                    await r.read()

        hogs: list[asyncio.Task[None]] = []

        async def saturate() -> None:
            hogs.extend(asyncio.create_task(hog(i)) for i in range(120))

        try:
            await _fault_under_load(g, 4.0, 0.5, saturate, timeout=5.0)
            in_flight = sum(not t.done() for t in hogs)
        finally:
            for t in hogs:
                t.cancel()
            await asyncio.gather(*hogs, return_exceptions=True)
            await hog_http.close()
        assert len(g.outcomes) > 150
        assert not failed(g.outcomes)
        assert in_flight >= 100, f"only {in_flight} hogs still running: the replica was not busy"
        health = await g.health()
        seen = {name: _judged(h) for name, h in health.items()}  # what a failure needs explained
        assert all(h["status"] == "healthy" for h in health.values()), (g.port(0), seen)
        moves = await g.transitions()
        assert not any(state in ("ejected", "degraded", "unreachable") for state, _ in moves), (moves, seen)
