"""``epp --workers N`` for real: N processes on one ext_proc port, one health and one /metrics per pod.

ext_proc streams are driven directly (no Envoy), each on its own connection, because
SO_REUSEPORT spreads connections, not streams, over the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.sync.hub import DEFAULT_COALESCE, SIBLING_COALESCE
from epp_sim.demo.procs import EppProcess, SimFleet, free_port, free_port_run
from tests.server.harness import destination_metadata, llm_request, resp_headers

pytestmark = pytest.mark.slow
STREAMS = 24


def _peer_port(workers: int) -> str:
    """``--peer-port`` at a free run of ports: worker *i* binds the base + 2i and the port after
    it, and the default base (9004) would collide with another multi-worker EPP started at the same
    time (``make test`` runs the unit tests on two xdist workers)."""
    return f"--peer-port={free_port_run(2 * workers)}"


def _channel(port: int) -> grpc.aio.Channel:
    """A channel of its own connection: grpc shares connections between a process's channels
    unless each has its own subchannel pool."""
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])


async def _route(port: int, prompt: str = "hello") -> str:
    """One ext_proc stream on a fresh connection; the endpoint the EPP picked."""
    async with _channel(port) as ch:
        return await _route_on(ch, prompt)


async def _route_on(ch: grpc.aio.Channel, prompt: str = "hello", *, wait_for_ready: bool = False) -> str:
    call = pb_grpc.ExternalProcessorStub(ch).Process(wait_for_ready=wait_for_ready)
    for m in llm_request(prompt, "m", "m"):
        await call.write(m)
    await call.done_writing()
    replies: list[pb.ProcessingResponse] = [r async for r in call]
    return next(d for r in replies if (d := destination_metadata(r)))


async def _metrics(epp: EppProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{epp.metrics_port}/metrics") as r:
        text = await r.text()
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


def _by_worker(series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> dict[str, float]:
    return {dict(labels)["worker"]: v for (n, labels), v in series.items() if n == name}


def _children(pid: int) -> dict[int, int]:
    """worker index -> pid, read from the supervisor's children's environments."""
    out = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        role = next(e for e in env if e.startswith(b"EPP_WORKER="))
        out[int(role.split(b'"index": ')[1].split(b",")[0])] = int(child)
    return out


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")  # reaped or a zombie


async def _until(cond: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await cond():
                return
            await asyncio.sleep(0.05)  # polling another process


async def _all_up(epp: EppProcess, workers: int) -> None:
    """SERVING needs half the workers: wait until every one answers worker 0."""

    async def reporting() -> bool:
        return (await _metrics(epp)).get(("epp_workers_reporting", ())) == workers

    await _until(reporting)


@contextlib.asynccontextmanager
async def _pod(workers: int, *args: str) -> AsyncIterator[tuple[SimFleet, EppProcess]]:
    async with SimFleet(2, "--time-scale", "0.02") as fleet:
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            f"--workers={workers}",
            _peer_port(workers),
            *args,
        )
        try:
            async with epp:
                if workers > 1:
                    await _all_up(epp, workers)
                yield fleet, epp
        except BaseException:
            print("---- epp log ----\n", epp.log_tail(200_000))
            raise


async def test_two_workers_share_the_port_and_one_metrics_endpoint_counts_both() -> None:
    async with _pod(2, "--decisions-buffer-size=64") as (fleet, epp):
        assert sorted(_children(epp.pid)) == [0, 1]
        picked = await asyncio.gather(*(_route(epp.grpc_port) for _ in range(STREAMS)))
        assert set(picked) <= set(fleet.hostports)
        series = await _metrics(epp)
        streams = _by_worker(series, "epp_worker_ext_proc_streams_total")
        assert set(streams) == {"0", "1"}
        assert all(v > 0 for v in streams.values()), streams  # both workers served
        assert sum(streams.values()) == STREAMS
        total = sum(v for (n, _), v in series.items() if n == "inference_objective_request_total")
        assert total == STREAMS  # each worker's counter, summed into the pod's
        assert series[("epp_workers_reporting", ())] == 2
        url = f"http://127.0.0.1:{epp.metrics_port}/debug/decisions?limit=100"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            decisions = (await r.json())["decisions"]
        assert len(decisions) == STREAMS  # both workers' rings, one pod-wide answer
        times = [d["time"] for d in decisions]
        assert times == sorted(times, reverse=True)
        url = f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            sync = (await r.json())["sync"]
        # worker 0's only peer is its sibling: it batches at the siblings' gap, not the replicas'
        assert len(sync["configuredPeers"]) == 1, sync
        assert SIBLING_COALESCE > DEFAULT_COALESCE  # so the check below tells the two apart
        assert sync["gapSeconds"] == SIBLING_COALESCE


async def test_a_killed_worker_is_restarted_and_no_new_stream_fails() -> None:
    async with _pod(2) as (_, epp):
        workers = _children(epp.pid)
        os.kill(workers[1], signal.SIGKILL)

        async def restarted() -> bool:
            series = await _metrics(epp)
            return (
                _by_worker(series, "epp_worker_restarts_total").get("1") == 1
                and series.get(("epp_workers_reporting", ())) == 2
                and await epp.serving()
            )

        await _until(restarted)
        assert _children(epp.pid)[1] != workers[1]
        await asyncio.gather(*(_route(epp.grpc_port) for _ in range(STREAMS)))  # any failure raises
        streams = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
        assert streams["1"] > 0  # the new worker 1 takes connections


async def test_sigterm_drains_every_worker_and_exits_0() -> None:
    async with _pod(2) as (_, epp):
        workers = _children(epp.pid)
        await epp.signal(signal.SIGTERM)
        assert await epp.wait(30) == 0
        assert all(_gone(pid) for pid in workers.values())


async def test_one_worker_is_the_single_process_epp() -> None:
    async with _pod(1) as (_, epp):
        assert _children(epp.pid) == {}  # no supervisor: the process serves itself
        await _route(epp.grpc_port)
        series = await _metrics(epp)
        assert not any(n.startswith("epp_worker") for n, _ in series)
        assert sum(v for (n, _), v in series.items() if n == "inference_objective_request_total") == 1


async def test_a_bad_config_exits_1_before_serving(tmp_path: Path) -> None:
    epp = EppProcess("--endpoints=127.0.0.1:1", "--workers=2", "--config-text=plugins: 7")
    await epp.start(wait=False)
    try:
        assert await epp.wait(30) == 1
    finally:
        await epp.stop()
        epp.cleanup()


def _run_dir(pid: int) -> Path:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    role = next(e for e in env if e.startswith(b"EPP_WORKER="))
    return Path(json.loads(role.split(b"=", 1)[1])["run_dir"])


async def _precise_state(url: str, unix: Path | None = None) -> dict[str, Any]:
    connector = aiohttp.UnixConnector(path=str(unix)) if unix is not None else None
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as r:
        doc: dict[str, Any] = await r.json()
    state: dict[str, Any] = doc["plugins"]["precise-prefix-cache-scorer"]
    return state


async def test_centralised_kv_events_reach_every_worker(tmp_path: Path) -> None:
    """Engines connect to the one zmqEndpoint worker 0 binds; worker 1 indexes them through the relay."""
    central = free_port()
    sim = ("--time-scale", "0.02", "--kv-events", f"tcp://127.0.0.1:{central}", "--prefix-caching-hash-algo",
           "sha256_cbor", "--hash-seed", "42")  # fmt: skip
    (tmp_path / "config.yaml").write_text(f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16, hashSeed: "42", hashAlgo: sha256_cbor}}
    kvEventsConfig: {{zmqEndpoint: "tcp://127.0.0.1:{central}", discoverPods: false}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: precise-prefix-cache-scorer}}]
""")
    async with SimFleet(2, *sim) as fleet:
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            "--workers=2",
            _peer_port(2),
            f"--config-file={tmp_path / 'config.yaml'}",
        )
        try:
            async with epp, aiohttp.ClientSession() as http:
                await _all_up(epp, 2)
                sibling = _run_dir(_children(epp.pid)[1]) / "w1.metrics.sock"
                primary_url = f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state"

                async def every_worker_heard_every_engine() -> bool:
                    for i, hp in enumerate(fleet.hostports):  # engines publish as they cache prompts
                        body = {"prompt": f"probe {i} {time.monotonic()} " + "p" * 64, "max_tokens": 1}
                        async with http.post(f"http://{hp}/v1/completions", json=body) as r:
                            assert r.status == 200
                    states = [
                        await _precise_state(primary_url),
                        await _precise_state("http://worker1/debug/plugins/state", sibling),
                    ]
                    return all(
                        len(st["endpoints"]) == 2 and all(e["batches"] > 0 for e in st["endpoints"].values())
                        for st in states
                    )

                await _until(every_worker_heard_every_engine)
                relayed = await _precise_state("http://worker1/debug/plugins/state", sibling)
                assert relayed["unattributedMessages"] == 0
        except BaseException:
            print("---- epp log ----\n", epp.log_tail(200_000))
            raise


async def _fail_through(ch: grpc.aio.Channel) -> str:
    """One ext_proc stream on ``ch`` whose upstream answers 500; the endpoint it was routed to."""
    call = pb_grpc.ExternalProcessorStub(ch).Process()
    for m in llm_request("hello", "m", "m"):
        await call.write(m)
    picked = ""
    async for r in call:
        if d := destination_metadata(r):
            picked = d
            await call.write(resp_headers({":status": "500"}, eos=True))
            await call.done_writing()
    return picked


async def _health(url: str, unix: Path | None = None) -> dict[str, str]:
    """endpoint address -> health status, as one worker sees it (/debug/plugins/state)."""
    connector = aiohttp.UnixConnector(path=str(unix)) if unix is not None else None
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as r:
        doc: dict[str, Any] = await r.json()
    return {e["address"]: e["health"]["status"] for e in doc["endpoints"]}


async def test_an_endpoint_one_worker_ejects_is_ejected_by_every_worker() -> None:
    """Upstream 500s reach one worker only (one connection); the other adopts its ejection."""
    async with _pod(2) as (fleet, epp):
        sibling = _run_dir(_children(epp.pid)[1]) / "w1.metrics.sock"

        async def views() -> list[dict[str, str]]:  # worker 0's own state, then worker 1's
            return [
                await _health(f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state"),
                await _health("http://worker1/debug/plugins/state", sibling),
            ]

        options = [("grpc.use_local_subchannel_pool", 1)]  # its own connection: one worker
        async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}", options=options) as ch:

            async def one_ejected() -> bool:
                await _fail_through(ch)
                return any("ejected" in view.values() for view in await views())

            await _until(one_ejected)
        seen = await views()
        ejected = {a for view in seen for a, st in view.items() if st == "ejected"}
        assert len(ejected) == 1 and ejected <= set(fleet.hostports), seen
        (address,) = ejected

        async def both_ejected() -> bool:
            return all(view.get(address) == "ejected" for view in await views())

        await _until(both_ejected, 10.0)


async def _worker_sample(sock: Path, name: str) -> float:
    """One worker's own sample ``name`` (no labels), from its Unix-socket /metrics."""
    conn = aiohttp.UnixConnector(path=str(sock))
    async with aiohttp.ClientSession(connector=conn) as s, s.get("http://worker/metrics") as r:
        text = await r.text()
    return next(
        smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples if smp.name == name
    )


async def test_synced_workers_report_one_prefix_index_not_the_sum_of_their_copies() -> None:
    name = "inference_extension_prefix_indexer_size"
    async with _pod(2) as (_, epp):
        sibling = _run_dir(_children(epp.pid)[1]) / "w1.metrics.sock"
        # long distinct prompts (many blocks each), on fresh connections: both workers route some
        prompts = [
            f"conversation {i}: " + "the quick brown fox jumps over the lazy dog " * 40 for i in range(16)
        ]
        await asyncio.gather(*(_route(epp.grpc_port, p) for p in prompts))
        streams = _by_worker(await _metrics(epp), "epp_worker_ext_proc_streams_total")
        assert len(streams) == 2 and all(v > 0 for v in streams.values()), streams

        async def sizes() -> tuple[float, float]:
            """Worker 0's index entries (its plugin state) and worker 1's gauge (its own socket)."""
            url = f"http://127.0.0.1:{epp.metrics_port}/debug/plugins/state"
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                state = await r.json()
            w0 = next(v["entries"] for v in state["plugins"].values() if "indexedHashes" in v)
            return float(w0), await _worker_sample(sibling, name)

        async def synced() -> bool:  # each worker inserted its sibling's chains: the same index
            w0, w1 = await sizes()
            return w0 == w1 > 0

        await _until(synced)
        w0, _ = await sizes()
        assert (await _metrics(epp))[(name, ())] == w0  # one index, held by both, counted once


async def _worker_pages(sock: Path, outcome: str) -> float:
    """One worker's own ``epp_scrape_pages_total{outcome}``, from its Unix-socket /metrics."""
    conn = aiohttp.UnixConnector(path=str(sock))
    async with aiohttp.ClientSession(connector=conn) as s, s.get("http://worker/metrics") as r:
        text = await r.text()
    return sum(
        smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if smp.name == "epp_scrape_pages_total" and smp.labels.get("outcome") == outcome
    )


async def test_worker_1_parses_worker_0s_pages_and_scrapes_itself_once_worker_0_is_killed() -> None:
    async with _pod(2) as (_, epp):
        kids = _children(epp.pid)
        w1 = _run_dir(kids[1]) / "w1.metrics.sock"

        async def sharing() -> bool:
            return await _worker_pages(w1, "shared") >= 20

        await _until(sharing)  # worker 1's polls parse worker 0's pages
        own = await _worker_pages(w1, "fetched")
        os.kill(kids[0], signal.SIGKILL)

        async def scraping_itself() -> bool:
            return await _worker_pages(w1, "fetched") >= own + 10

        await _until(scraping_itself)  # past the bound (2 polls) worker 1 scrapes the model servers


async def _connections(epp: EppProcess) -> dict[str, float]:
    """The proxy's connections each worker serves (``epp_worker_connections``)."""
    return _by_worker(await _metrics(epp), "epp_worker_connections")


def _moved(series: dict[tuple[str, tuple[tuple[str, str], ...]], float], how: str) -> float:
    return sum(
        v
        for (n, labels), v in series.items()
        if n == "epp_worker_connections_moved_total" and ("how", how) in labels
    )


async def test_connections_are_spread_over_the_workers_by_count_not_by_hash() -> None:
    """Four connections opened one after another serve two on each worker, every round, and a
    health prober's connection does not count.  SO_REUSEPORT's hash alone splits four 2:2 in
    6 cases of 16: six rounds would pass by chance 0.3% of the time."""
    async with _pod(2, "--health-checking") as (_, epp):
        for _ in range(6):
            async with _channel(epp.grpc_port) as prober:
                check = prober.unary_unary(
                    "/grpc.health.v1.Health/Check",
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString,
                )
                await check(health_pb2.HealthCheckRequest())
                channels = [_channel(epp.grpc_port) for _ in range(4)]
                try:
                    for ch in channels:
                        await _route_on(ch)  # connected, counted and placed before the next opens
                    assert await _connections(epp) == {"0": 2, "1": 2}
                finally:
                    for ch in channels:
                        await ch.close()

            async def closed() -> bool:
                return await _connections(epp) == {"0": 0, "1": 0}

            await _until(closed)
        series = await _metrics(epp)
        assert _moved(series, "handed") == _moved(series, "received")  # every handover went through
        assert _moved(series, "failed") == 0


async def _reconnected(ch: grpc.aio.Channel) -> None:
    """Route on ``ch`` until a stream succeeds: one sent on a killed worker's connection fails."""
    for _ in range(5):
        with contextlib.suppress(grpc.aio.AioRpcError):
            await _route_on(ch, wait_for_ready=True)
            return
    await _route_on(ch, wait_for_ready=True)


async def test_a_restarted_worker_gets_its_share_back_and_no_stream_is_lost() -> None:
    """Worker 1 dies: its connection's client reconnects to worker 0, the only one listening, which
    then holds both.  Once worker 1 is back, worker 0 retires one connection (GOAWAY that refuses
    no stream); its client reconnects and the connection is placed on worker 1.  Both clients keep
    routing throughout, and no stream fails after the restart."""
    async with _pod(2) as (_, epp), _channel(epp.grpc_port) as a, _channel(epp.grpc_port) as b:
        await _route_on(a)
        await _route_on(b)
        assert await _connections(epp) == {"0": 1, "1": 1}
        os.kill(_children(epp.pid)[1], signal.SIGKILL)
        for ch in (a, b):  # the one that was on worker 1 reconnects to worker 0
            await _reconnected(ch)
        assert (await _connections(epp)).get("0") == 2

        async def restarted() -> bool:
            series = await _metrics(epp)
            return (
                _by_worker(series, "epp_worker_restarts_total").get("1") == 1
                and series.get(("epp_workers_reporting", ())) == 2
            )

        await _until(restarted)
        routed = 0
        async with asyncio.timeout(30):
            while await _connections(epp) != {"0": 1, "1": 1}:
                await asyncio.gather(_route_on(a), _route_on(b))  # any failure raises
                routed += 2
                await asyncio.sleep(0.05)  # the rebalancing tick is once a second
        series = await _metrics(epp)
        assert _moved(series, "retired") >= 1
        assert _by_worker(series, "epp_worker_ext_proc_streams_total")["1"] > 0
        assert routed > 0


async def test_a_connect_flood_leaves_no_count_behind_and_routing_goes_on() -> None:
    """300 connections opened at once and dropped, some after a garbage preface, some reset:
    whoever accepted or adopted them, every worker's count returns to zero (no connection is
    left counted by a handover or a failed adoption), and routing goes on on both workers."""
    async with _pod(2) as (_, epp):

        async def one(i: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", epp.grpc_port)
            if i % 3 == 0:
                writer.write(b"GET / HTTP/1.1\r\n\r\n")  # not HTTP/2: the server drops it
            elif i % 3 == 1:
                writer.transport.abort()  # a reset, maybe before the handover is read
                return
            await writer.drain()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            del reader

        await asyncio.gather(*(one(i) for i in range(300)))

        async def settled() -> bool:
            return await _connections(epp) == {"0": 0, "1": 0}

        await _until(settled)
        series = await _metrics(epp)
        assert _moved(series, "handed") > 0  # the flood was placed, not only hashed
        async with _channel(epp.grpc_port) as a, _channel(epp.grpc_port) as b:
            await _route_on(a)
            await _route_on(b)
            assert await _connections(epp) == {"0": 1, "1": 1}
