"""One of two active EPPs SIGKILLed under a steady trickle of requests, through the real Envoy
running deploy/envoy/active-active.yaml: its health check drops the dead EPP within a second, and
every request sent after that succeeds on the other one (issue 30, "Faults")."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from epp.testing.waiting import until_async
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.deploy.envoy import RunningEnvoy, active_active, run
from tests.e2e.conftest import FAST_SIM, both_serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 40.0  # requests per second, open loop
AFTER_DROP = 80  # requests sent once the dead EPP is out of the rotation (2 s at RATE)
DROP_WITHIN = 1.0  # seconds from SIGKILL to the health check taking it out


@dataclass(frozen=True, slots=True)
class Sent:
    at: float  # time.monotonic() when sent
    status: int  # HTTP status, or -1 for a connection error
    done: float  # time.monotonic() when answered


async def trickle(http: aiohttp.ClientSession, url: str, sent: list[Sent], stop: asyncio.Event) -> None:
    """Requests at RATE until ``stop``, each recorded with when it left and how it ended."""

    async def one(i: int) -> None:
        at = time.monotonic()
        body = {"model": "mock-model", "prompt": f"trickle {i}", "max_tokens": 2}
        try:
            async with http.post(url + "/v1/completions", json=body) as r:
                await r.read()
                sent.append(Sent(at, r.status, time.monotonic()))
        except aiohttp.ClientError:
            sent.append(Sent(at, -1, time.monotonic()))

    tasks: list[asyncio.Task[None]] = []
    start = time.monotonic()
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(len(tasks))))
        await asyncio.sleep(max(0.0, start + len(tasks) / RATE - time.monotonic()))  # pacing: open loop
    await asyncio.gather(*tasks)


async def two_epps_behind_envoy(
    body: Callable[[RunningEnvoy, aiohttp.ClientSession, EppProcess, EppProcess], Awaitable[None]],
) -> None:
    """A fleet of two simulated model servers, two EPPs on it, Envoy on active-active.yaml."""
    async with SimFleet(2, *FAST_SIM) as fleet:
        endpoints = f"--endpoints={','.join(fleet.hostports)}"
        doomed = EppProcess(endpoints, "--bind-address=127.0.0.1")
        survivor = EppProcess(endpoints, "--bind-address=127.0.0.1")
        async with both_serving(doomed, survivor):  # started side by side
            config = active_active([(e.grpc_port, e.health_port) for e in (doomed, survivor)])
            async with run(config) as envoy, aiohttp.ClientSession() as http:
                try:
                    await body(envoy, http, doomed, survivor)
                except BaseException:
                    print(
                        "---- envoy log ----\n",
                        envoy.log_tail(),
                        "\n---- epp log ----\n",
                        survivor.log_tail(),
                    )
                    raise


async def test_a_killed_epp_leaves_the_rotation_and_no_later_request_fails() -> None:
    await two_epps_behind_envoy(kill_one_under_load)


async def test_a_stopped_epp_loses_no_request() -> None:
    """SIGTERM (a rolling update, a drain): the EPP reports NOT_SERVING, Envoy's health check moves
    new streams to the other replica, and only then does it close; not one request fails."""
    await two_epps_behind_envoy(stop_one_under_load)


async def stop_one_under_load(
    envoy: RunningEnvoy, http: aiohttp.ClientSession, leaving: EppProcess, staying: EppProcess
) -> None:
    async def both_take_streams() -> bool:
        hosts = await envoy.hosts("ext_proc")
        return all(
            hosts[e.grpc_port].in_rotation and hosts[e.grpc_port].streams >= 5 for e in (leaving, staying)
        )

    sent: list[Sent] = []
    stop = asyncio.Event()
    load = asyncio.create_task(trickle(http, envoy.url, sent, stop))
    await until_async(both_take_streams, 15, what="both EPPs route requests (active-active)", every=0.01)
    term_at = time.monotonic()
    await leaving.signal(signal.SIGTERM)
    assert await leaving.wait(30) == 0  # drained and exited cleanly
    exited_at = time.monotonic()

    async def enough_after() -> bool:
        return sum(s.at > exited_at for s in sent) >= AFTER_DROP

    await until_async(
        enough_after,
        AFTER_DROP / RATE * 3 + 10,
        what=f"{AFTER_DROP} requests answered after the exit",
        every=0.01,
    )
    stop.set()
    await load
    assert not (await envoy.hosts("ext_proc"))[leaving.grpc_port].in_rotation
    assert sum(term_at <= s.at <= exited_at for s in sent) >= 5  # requests were sent while it drained
    assert [s for s in sent if s.status != 200] == []


async def kill_one_under_load(
    envoy: RunningEnvoy, http: aiohttp.ClientSession, doomed: EppProcess, survivor: EppProcess
) -> None:
    async def both_in_rotation() -> bool:
        hosts = await envoy.hosts("ext_proc")
        return all(hosts[e.grpc_port].in_rotation for e in (doomed, survivor))

    await until_async(both_in_rotation, 10, what="both EPPs pass Envoy's health check", every=0.01)
    sent: list[Sent] = []
    stop = asyncio.Event()
    load = asyncio.create_task(trickle(http, envoy.url, sent, stop))

    async def both_take_streams() -> bool:
        hosts = await envoy.hosts("ext_proc")
        return all(hosts[e.grpc_port].streams >= 5 for e in (doomed, survivor))

    await until_async(both_take_streams, 15, what="both EPPs route requests (active-active)", every=0.01)
    served_before = (await envoy.hosts("ext_proc"))[survivor.grpc_port].streams  # before any `after` is sent
    killed_at = time.monotonic()
    await doomed.signal(signal.SIGKILL)

    async def dropped() -> bool:
        return not (await envoy.hosts("ext_proc"))[doomed.grpc_port].in_rotation

    dropped_at = await until_async(dropped, 5, what="Envoy drops the killed EPP", every=0.01)

    async def enough_after() -> bool:
        return sum(s.at > dropped_at for s in sent) >= AFTER_DROP

    await until_async(
        enough_after,
        AFTER_DROP / RATE * 3 + 10,
        what=f"{AFTER_DROP} requests answered after the drop",
        every=0.01,
    )
    stop.set()
    await load

    assert dropped_at - killed_at <= DROP_WITHIN
    before = [s for s in sent if s.done < killed_at]  # answered before the kill: the setup works
    after = [s for s in sent if s.at > dropped_at]
    assert before and all(s.status == 200 for s in before)
    assert len(after) >= AFTER_DROP
    assert [s for s in after if s.status != 200] == []
    assert (await envoy.hosts("ext_proc"))[survivor.grpc_port].streams >= served_before + len(after)
    window = [s for s in sent if s.done >= killed_at and s.at <= dropped_at]  # in flight or sent meanwhile
    print(
        f"dropped {dropped_at - killed_at:.3f}s after SIGKILL; in that window "
        f"{sum(s.status != 200 for s in window)}/{len(window)} requests failed; "
        f"{len(after)} after it, all 200"
    )
