"""Issue 17 end to end: the precise prefix scorer routes on live KV events from the simulator
fleet through Envoy, and survives an engine restart and event gaps (replayed, or not); the shipped
example's flow control holds requests in the EPP while the engines are full."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import yaml

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet, free_port
from tests.e2e.conftest import FAST_SIM, QUICK_STOP, Reply, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mock-model"
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "config" / "examples" / "precise-prefix.yaml"
SIM_ARGS = (
    *FAST_SIM,
    "--kv-events", "tcp://127.0.0.1:0",
    "--kv-events-replay", "tcp://127.0.0.1:0",
    "--prefix-caching-hash-algo", "sha256_cbor",
    "--hash-seed", "42",
    "--enable-prompt-tokens-details",
    "--override", "replica=2,kv-events-buffer-steps=1",  # replica 2 cannot replay a gap
)  # fmt: skip


def config(fleet: SimFleet) -> str:
    subs = {f"127.0.0.1:{d['port']}": d["kv_events"] for d in fleet.listeners}
    replays = {f"127.0.0.1:{d['port']}": d["kv_replay"] for d in fleet.listeners}
    return f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {{blockSize: 16, hashSeed: "42", hashAlgo: sha256_cbor}}
    kvEventsConfig:
      endpoints: {subs}
      replayEndpoints: {replays}
      silenceTimeoutSeconds: 30
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: precise-prefix-cache-scorer, weight: 4}}
  - {{pluginRef: queue-scorer, weight: 1}}
"""


def example_config(fleet: SimFleet, max_concurrency: int) -> str:
    """config/examples/precise-prefix.yaml as shipped, but with the fleet's event sockets instead
    of pod discovery (no cluster here) and flow control's ``maxConcurrency`` set for the test."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for plugin in doc["plugins"]:
        if plugin["type"] == "precise-prefix-cache-scorer":
            events = plugin["parameters"]["kvEventsConfig"]
            del events["podDiscoveryConfig"], events["replayPort"]
            events["discoverPods"] = False
            events["endpoints"] = {f"127.0.0.1:{d['port']}": d["kv_events"] for d in fleet.listeners}
            events["replayEndpoints"] = {f"127.0.0.1:{d['port']}": d["kv_replay"] for d in fleet.listeners}
        elif plugin["type"] == "concurrency-detector":
            plugin["parameters"]["maxConcurrency"] = max_concurrency
    return str(yaml.safe_dump(doc))


@contextlib.asynccontextmanager
async def precise_stack(
    tmp: pathlib.Path, make_config: Callable[[SimFleet], str] = config
) -> AsyncIterator[Stack]:
    admin = free_port()
    async with SimFleet(3, *SIM_ARGS, "--admin-port", str(admin)) as fleet:
        (tmp / "config.yaml").write_text(make_config(fleet))
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
            "--v=3",
            f"--config-file={tmp / 'config.yaml'}",
        )
        async with epp:
            cfg = EnvoyConfig(ext_proc_port=epp.grpc_port, access_log=str(tmp / "access.log"))
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                stack = Stack(fleet, epp, proxy, http, tmp, extra={"admin": admin})
                try:
                    yield stack
                except BaseException:
                    print("---- epp log ----\n", epp.log_tail(), "\n---- envoy log ----\n", proxy.log_tail())
                    raise


def chat(system: str, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2}


_prefixes = itertools.count()


async def plugin_state(s: Stack) -> dict[str, Any]:
    async with s.http.get(f"http://127.0.0.1:{s.epp.metrics_port}/debug/plugins/state") as r:
        doc: dict[str, Any] = await r.json()
    state: dict[str, Any] = doc["plugins"]["precise-prefix-cache-scorer"]
    return state


async def endpoint_state(s: Stack, hostport: str) -> dict[str, Any]:
    eps = (await plugin_state(s))["endpoints"]
    (entry,) = [e for e in eps.values() if e["hostport"] == hostport]
    return dict(entry)


async def land_on(s: Stack, target: str) -> str:
    """A new long system prompt whose first request the EPP sent to ``target``."""
    for _ in range(60):
        system = f"Tenant {next(_prefixes)} policy. " + "Rules of the house apply. " * 120
        r = await s.post("/v1/chat/completions", chat(system, "q0"))
        assert r.status == 200
        if r.served_by == target:
            return system
    raise AssertionError(f"no new prefix landed on {target}")


async def all_follow(s: Stack, system: str, n: int = 5) -> set[str]:
    replies: list[Reply] = [await s.post("/v1/chat/completions", chat(system, f"q{i + 1}")) for i in range(n)]
    assert all(r.status == 200 for r in replies)
    return {r.served_by for r in replies}


async def test_precise_routing_restart_and_gaps(tmp_path: pathlib.Path) -> None:
    async with precise_stack(tmp_path) as s:
        hostports = s.fleet.hostports
        # every subscriber receives events (each replica serves some first request)
        for hp in hostports:
            await land_on(s, hp)
        # 1. requests sharing a long prefix go to the replica whose engine reported caching it
        first = await s.post("/v1/chat/completions", chat("Shared prefix. " + "Context line. " * 200, "q0"))
        assert await all_follow(s, "Shared prefix. " + "Context line. " * 200) == {first.served_by}
        state = await plugin_state(s)
        assert state["indexedBlocks"] > 0
        assert all(e["consistent"] for e in state["endpoints"].values())
        seen = state["predictedVsObserved"]
        assert seen["samples"] >= 5 and seen["meanPredictedTokens"] > 0 and seen["pearson"] is not None

        # 2. a gap on a replica with replay: recovered from its replay socket, routing unchanged
        a = hostports[0]
        system_a = await land_on(s, a)
        await s.sim_faults(0, kv_events_drop=1)
        assert await all_follow(s, system_a, 3) == {a}
        await until_state(s, a, lambda e: e["gaps"] == 1 and e["replays"] == 1 and e["consistent"])

        # 3. a gap on the replica without replay: its blocks are dropped (they may be stale) and it
        #    is scored from the larger of its fresh events and the approximate index until its engine
        #    clears its cache (POST /reset_prefix_cache: AllBlocksCleared); then it is trusted again
        c = hostports[2]
        system_c = await land_on(s, c)
        await s.sim_faults(2, kv_events_drop=1)
        await s.post("/v1/chat/completions", chat(system_c, "lost"))  # its batch is dropped
        await s.post("/v1/chat/completions", chat(system_c, "seen"))  # its batch reveals the gap
        await until_state(s, c, lambda e: e["gaps"] == 1 and e["rebuilding"] and not e["consistent"])
        fallbacks_before = await fallback_count(s, c)
        assert await all_follow(s, system_c, 3) == {c}  # the approximate index still knows the prefix
        assert await fallback_count(s, c) >= fallbacks_before + 3
        async with s.http.post(f"http://{c}/reset_prefix_cache") as r:
            assert r.status == 200
        await until_state(s, c, lambda e: e["consistent"] and not e["rebuilding"] and e["clears"] == 1)

        # 4. an engine restart: seq goes back to 0, the replica's blocks are dropped, events resume
        b = hostports[1]
        await s.sim_faults(1, crashed=True)
        async with s.http.post(
            f"http://127.0.0.1:{s.extra['admin']}/sim/faults", json={"replica": 1, "crashed": False}
        ) as r:
            assert r.status == 200  # the crashed replica does not listen: the fleet's admin port restarts it
        system_b = await land_on(s, b)
        await until_state(s, b, lambda e: e["restarts"] == 1 and e["consistent"] and e["blocks"] > 0)
        assert await all_follow(s, system_b, 3) == {b}
        final = (await plugin_state(s))["predictedVsObserved"]
        print("predictedVsObserved:", final)  # shown with -s: the running correlation over this test
        assert final["pearson"] is not None and final["pearson"] >= 0.9  # issue 17 goal


async def until_state(s: Stack, hostport: str, cond: Any, timeout: float = 15.0) -> None:
    """Poll the EPP's debug state until ``cond(endpoint state)`` holds."""
    last: dict[str, Any] = {}
    async with asyncio.timeout(timeout):
        while True:
            last = await endpoint_state(s, hostport)
            if cond(last):
                return
            await asyncio.sleep(0.05)  # poll interval of the EPP's debug endpoint


async def until_events_arrive(s: Stack, hostport: str, timeout: float = 15.0) -> None:
    """Land new prefixes on ``hostport`` until the EPP has applied a batch of its events.

    A connecting PUB socket drops what it publishes before the subscriber's subscription reaches
    it (ZMQ's slow joiner; vLLM's publisher does not wait either), so an engine's first batch can
    be lost when its connection to the EPP's bound socket is only being (re)established.  The
    next request's batch arrives; one request and a wait would hang on the lost one."""
    async with asyncio.timeout(timeout):
        while True:
            await land_on(s, hostport)
            try:
                await until_state(s, hostport, lambda e: e["batches"] > 0 and e["consistent"], timeout=1.0)
                return
            except TimeoutError:
                continue


async def fallback_count(s: Stack, hostport: str) -> float:
    metrics = await s.epp_metrics()
    name = next(k for k, e in (await plugin_state(s))["endpoints"].items() if e["hostport"] == hostport)
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("epp_precise_prefix_fallback_total{") and f'endpoint="{name}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_example_flow_control_holds_requests_while_the_engines_are_full(tmp_path: pathlib.Path) -> None:
    """The shipped example with ``maxConcurrency: 2`` on three replicas: with every engine paused,
    six requests reach the engines and the other three wait in the EPP, not in an engine's queue;
    when the engines run again, the held ones are routed as the first ones end, and all succeed."""
    async with precise_stack(tmp_path, lambda fleet: example_config(fleet, 2)) as s:
        for replica in range(3):
            await s.sim_faults(replica, paused=True)
        system = "Held prefix. " + "Context line. " * 100
        tasks = [asyncio.create_task(s.post("/v1/chat/completions", chat(system, f"q{i}"))) for i in range(9)]
        seen: tuple[float, float] = (0.0, 0.0)
        try:
            async with asyncio.timeout(15):
                while True:
                    seen = (await held_in_epp(s), await waiting_in_engines(s))
                    if seen == (3.0, 6.0):
                        break
                    await asyncio.sleep(0.05)  # poll interval of the EPP's and the engines' metrics
        except TimeoutError:
            raise AssertionError(f"held in the EPP, waiting in the engines: {seen}, not (3, 6)") from None
        for replica in range(3):
            await s.sim_faults(replica, paused=False)
        replies = await asyncio.gather(*tasks)
        assert [r.status for r in replies] == [200] * 9
        assert await held_in_epp(s) == 0
        dispatched = metric_sum(
            await s.epp_metrics(), "inference_extension_flow_control_request_queue_duration_seconds_count"
        )
        assert dispatched == 9


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric's samples over all its label sets."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
    )


async def held_in_epp(s: Stack) -> float:
    return metric_sum(await s.epp_metrics(), "inference_extension_flow_control_queue_size")


async def waiting_in_engines(s: Stack) -> float:
    total = 0.0
    for hostport in s.fleet.hostports:
        async with s.http.get(f"http://{hostport}/metrics") as r:
            total += metric_sum(await r.text(), "vllm:num_requests_waiting")
    return total


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all(w in line for w in want)
    )


async def test_lying_and_silent_publishers_fall_back(tmp_path: pathlib.Path) -> None:
    """Issue 29's KV-event gray failures through Envoy: an engine restarted under another hash
    algorithm and seed is a hash-scheme mismatch (log line, metric, inconsistent) from the first
    batch it publishes, and trusted again once it restarts as configured; a publisher gone silent
    while its engine serves is inconsistent within silenceTimeoutSeconds of the first response
    and scored from the approximate index, and trusted again when its events resume."""
    silence = 1.0

    def short_silence(fleet: SimFleet) -> str:
        return config(fleet).replace("silenceTimeoutSeconds: 30", f"silenceTimeoutSeconds: {silence}")

    async with precise_stack(tmp_path, short_silence) as s:
        a, b = s.fleet.hostports[0], s.fleet.hostports[1]
        for hp in s.fleet.hostports:
            await land_on(s, hp)
        passed = (await endpoint_state(s, a))["hashChecks"]["passed"]
        assert passed >= 1

        # 1. a rolling upgrade: replica 0 restarts hashing with pickle and another seed
        await s.sim_faults(0, restart_hash_algo="sha256", restart_hash_seed="7")
        await land_on(s, a)  # a new prefix: its engine publishes blocks the EPP cannot reproduce
        await until_state(s, a, lambda e: e["restarts"] == 1 and e["mismatch"] == "hash_scheme")
        e = await endpoint_state(s, a)
        assert not e["consistent"] and e["hashChecks"]["failed"] == 1  # decided in its first batch
        assert "hash_scheme mismatch" in e["reason"]
        metrics = await s.epp_metrics()
        name = next(k for k, v in (await plugin_state(s))["endpoints"].items() if v["hostport"] == a)
        assert metric_value(metrics, "epp_kv_events_mismatch_total", endpoint=name, kind="hash_scheme") == 1
        assert metric_value(metrics, "epp_kv_events_hash_checks_total", endpoint=name, outcome="failed") == 1
        assert (
            metric_value(
                metrics,
                "epp_kv_events_consistency_transitions_total",
                endpoint=name,
                consistent="false",
                cause="hash_scheme_mismatch",
            )
            == 1
        )
        assert "kv_events_config_mismatch" in s.epp.log_tail(200_000)
        # restarted as configured: verified afresh and trusted
        await s.sim_faults(0, restart_hash_algo="", restart_hash_seed=None)
        await land_on(s, a)
        await until_state(s, a, lambda e: e["restarts"] == 2 and e["consistent"] and e["mismatch"] is None)

        # 2. replica 1's publisher goes silent while its engine serves
        await s.sim_faults(1, kv_events_silent=True)
        system_b = await land_on(s, b)
        served = asyncio.get_running_loop().time()
        await until_state(s, b, lambda e: not e["consistent"], timeout=10.0)
        detected = asyncio.get_running_loop().time() - served
        e = await endpoint_state(s, b)
        assert e["reason"].startswith(f"silent publisher: no events for {silence:g}s")
        # the watchdog checks every silence/4; allow for a loaded CI machine, well under 10 s
        assert detected < 3 * silence, detected
        fallbacks = await fallback_count(s, b)
        assert await all_follow(s, system_b, 3) == {b}  # the approximate index routes the prefix
        assert await fallback_count(s, b) >= fallbacks + 3
        # events resume: the skipped batches are replayed and the endpoint is trusted again
        await s.sim_faults(1, kv_events_silent=False)
        await land_on(s, b)
        await until_state(s, b, lambda e: e["consistent"] and e["replays"] >= 1)


async def test_centralised_kv_events_route_through_envoy(tmp_path: pathlib.Path) -> None:
    """llm-d's centralised mode: the EPP binds ``kvEventsConfig.zmqEndpoint``, every simulated
    engine connects to it (vLLM's publisher rule: no ``*`` in the endpoint) with a topic naming
    its host:port, and requests sharing a prefix follow the replica whose events report it."""
    central = free_port()
    args = (
        *FAST_SIM,
        "--kv-events", f"tcp://127.0.0.1:{central}",
        "--prefix-caching-hash-algo", "sha256_cbor",
        "--hash-seed", "42",
        "--enable-prompt-tokens-details",
    )  # fmt: skip
    async with SimFleet(3, *args) as fleet:
        (tmp_path / "config.yaml").write_text(f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16, hashSeed: "42", hashAlgo: sha256_cbor}}
    kvEventsConfig: {{zmqEndpoint: "tcp://127.0.0.1:{central}", discoverPods: false, concurrency: 4}}
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: precise-prefix-cache-scorer, weight: 4}}
  - {{pluginRef: queue-scorer, weight: 1}}
""")
        epp = EppProcess(
            f"--endpoints={','.join(fleet.hostports)}",
            "--bind-address=127.0.0.1",
            QUICK_STOP,
            "--v=3",
            f"--config-file={tmp_path / 'config.yaml'}",
        )
        async with epp:
            cfg = EnvoyConfig(ext_proc_port=epp.grpc_port, access_log=str(tmp_path / "access.log"))
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                s = Stack(fleet, epp, proxy, http, tmp_path)
                try:
                    for hp in fleet.hostports:  # every engine's connection carries events
                        await until_events_arrive(s, hp)
                    state = await plugin_state(s)
                    assert state["centralEndpoint"] == f"tcp://127.0.0.1:{central}"
                    assert state["unattributedMessages"] == 0
                    system = "Centralised prefix. " + "Context line. " * 200
                    first = await s.post("/v1/chat/completions", chat(system, "q0"))
                    assert first.status == 200
                    await until_state(s, first.served_by, lambda e: e["blocks"] >= 40)
                    assert await all_follow(s, system) == {first.served_by}
                except BaseException:
                    print("---- epp log ----\n", epp.log_tail(), "\n---- envoy log ----\n", proxy.log_tail())
                    raise
