"""``epp --workers 2`` behind a real Envoy with two worker threads: both EPP workers route.

Envoy opens one ext_proc connection per worker thread, and keeps it.  Left to SO_REUSEPORT's
hash, both land on one EPP worker half the time, and the pod routes on one core for as long as
Envoy runs; its health checker's connection (to the same port here) would count as much as a
thread's.  Four Envoy starts in a row, each with its connections split evenly, pass by chance
about once in sixteen runs without the balance (``epp.workers.balance``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from epp.testing.waiting import until_async
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port_run
from tests.e2e.conftest import FAST_SIM
from tests.e2e.test_epp_failover_envoy import Sent, trickle
from tests.workers.test_epp_workers import _all_up, _by_worker, _children, _connections, _metrics, _moved

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUNDS = 4
REQUESTS = 32  # each on its own client connection, so both of Envoy's threads carry some


async def _send(http: aiohttp.ClientSession, url: str, i: int) -> int:
    body = {"model": "mock-model", "prompt": f"spread {i}", "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        await r.read()
        return r.status


def _two_workers(fleet: SimFleet, *extra: str) -> EppProcess:
    return EppProcess(
        f"--endpoints={','.join(fleet.hostports)}",
        "--bind-address=127.0.0.1",
        "--workers=2",
        f"--peer-port={free_port_run(4)}",  # two ports a worker
        *extra,
    )


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls"])
async def test_each_envoy_thread_connection_is_served_by_its_own_worker(tls: bool) -> None:
    """With TLS the handshake is the adopting worker's: a connection crosses before its first byte."""
    async with SimFleet(2, *FAST_SIM) as fleet:
        epp = _two_workers(fleet, "--health-checking", f"--secure-serving={str(tls).lower()}")
        async with epp:
            await _all_up(epp, 2)
            for _ in range(ROUNDS):
                before = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
                cfg = EnvoyConfig(
                    ext_proc_port=epp.grpc_port,
                    ext_proc_replicas=[(epp.grpc_port, epp.grpc_port)],  # probed on the ext_proc port
                    concurrency=2,
                    ext_proc_tls=tls,
                )
                async with Envoy(cfg) as proxy:
                    connector = aiohttp.TCPConnector(force_close=True)  # a connection a request
                    async with aiohttp.ClientSession(connector=connector) as http:

                        async def even() -> bool:
                            """Requests flowing, Envoy's connections split evenly.  Usually at once;
                            a prober's connection counts until its first stream shows what it is,
                            and a traffic connection placed meanwhile is moved by a retirement."""
                            statuses = await asyncio.gather(
                                *(_send(http, proxy.url, i) for i in range(REQUESTS))
                            )
                            assert statuses == [200] * REQUESTS, proxy.log_tail()
                            # Envoy opens one a thread, more when streams burst before the first is up
                            opened = (await proxy.stats())["cluster.ext_proc.upstream_cx_active"]
                            held = await _connections(epp)
                            # the prober's is not counted
                            return sum(held.values()) == opened >= 2 and abs(held["0"] - held["1"]) <= 1

                        await until_async(even, timeout=15, what="Envoy's connections split evenly")
                    after = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
                    assert all(after[w] > before.get(w, 0) for w in ("0", "1")), (before, after)

                async def released() -> bool:
                    return await _connections(epp) == {"0": 0, "1": 0}

                await until_async(released, timeout=10)


async def test_a_restarted_worker_gets_an_envoy_connection_back_and_no_request_fails() -> None:
    """Worker 1 is SIGKILLed under a trickle of requests through Envoy (two threads, a connection
    each): the requests on its connection fail with it, Envoy reconnects to worker 0, the only
    one listening.  Once worker 1 is back, worker 0 retires one of its two connections (the
    two-step GOAWAY); Envoy moves to a new connection, placed on worker 1.  Not one request sent
    after worker 1 is back fails, and worker 1 routes again."""
    async with SimFleet(2, *FAST_SIM) as fleet:
        epp = _two_workers(fleet)
        async with epp:
            await _all_up(epp, 2)
            cfg = EnvoyConfig(ext_proc_port=epp.grpc_port, concurrency=2)
            async with Envoy(cfg) as proxy:
                connector = aiohttp.TCPConnector(force_close=True)
                async with aiohttp.ClientSession(connector=connector) as http:
                    statuses = await asyncio.gather(*(_send(http, proxy.url, i) for i in range(REQUESTS)))
                    assert statuses == [200] * REQUESTS
                    held = await _connections(epp)
                    assert held["0"] >= 1 and held["1"] >= 1, held
                    sent: list[Sent] = []
                    stop = asyncio.Event()
                    load = asyncio.create_task(trickle(http, proxy.url, sent, stop))
                    os.kill(_children(epp.pid)[1], signal.SIGKILL)

                    async def restarted() -> bool:
                        series = await _metrics(epp)
                        return (
                            _by_worker(series, "epp_worker_restarts_total").get("1") == 1
                            and series.get(("epp_workers_reporting", ())) == 2
                        )

                    await until_async(restarted, timeout=30, what="worker 1 restarted")
                    back_at = time.monotonic()
                    before = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total").get("1", 0)

                    async def shared_again() -> bool:
                        series = await _metrics(epp)
                        return (
                            _moved(series, "retired") >= 1
                            and _by_worker(series, "epp_worker_ext_proc_streams_total").get("1", 0) > before
                        )

                    await until_async(shared_again, timeout=30, what="worker 1 routes Envoy's streams again")
                    moved_at = time.monotonic()

                    async def a_second_more() -> bool:  # requests on the new connection too
                        return sum(s.at > moved_at for s in sent) >= 40

                    await until_async(a_second_more, timeout=30, what="40 requests after the move")
                    stop.set()
                    await load
                    after = [s for s in sent if s.at > back_at]
                    assert [s for s in after if s.status != 200] == [], proxy.log_tail()


async def test_one_envoy_thread_reaches_every_worker_past_its_streams_per_connection() -> None:
    """Envoy with one thread opens one ext_proc connection, which one worker would serve alone;
    the shipped configs cap a connection's streams (``max_concurrent_streams``, 100), so with more
    requests in flight the thread opens more connections, placed on both workers."""
    in_flight = 300
    slow = ("--time-scale", "0.5", "--seed", "7", "--max-model-len", "131072")  # all still streaming
    async with SimFleet(2, *slow) as fleet:
        epp = _two_workers(fleet)
        async with epp:
            await _all_up(epp, 2)
            cfg = EnvoyConfig(ext_proc_port=epp.grpc_port, concurrency=1)
            assert cfg.ext_proc_streams_per_connection == 100
            async with Envoy(cfg) as proxy:
                before = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

                    async def held(i: int) -> int:
                        body = {
                            "model": "mock-model",
                            "prompt": f"held {i}",
                            "max_tokens": 40,
                            "stream": True,
                        }
                        async with http.post(f"{proxy.url}/v1/completions", json=body) as r:
                            await r.read()
                            return r.status

                    statuses = await asyncio.gather(*(held(i) for i in range(in_flight)))
                assert statuses == [200] * in_flight, proxy.log_tail()
                opened = (await proxy.stats())["cluster.ext_proc.upstream_cx_total"]
                assert opened >= 3, opened  # 300 streams at once, 100 a connection
                held_by = await _connections(epp)
                assert held_by["0"] >= 1 and held_by["1"] >= 1, held_by
                after = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
                served = {w: after[w] - before.get(w, 0) for w in ("0", "1")}
                assert min(served.values()) >= in_flight // 4, served  # both route a real share
