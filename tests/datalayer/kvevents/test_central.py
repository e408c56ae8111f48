"""Centralised KV events (llm-d's ``kvEventsConfig.zmqEndpoint``): the EPP binds one SUB socket,
engines connect and publish with a topic naming their endpoint; per-endpoint subscription runs
beside it, and an engine moving from one to the other is a restart, not an outage."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import aiohttp
import msgspec

from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.index import BlockIndex, EndpointState
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.testing.builders import make_endpoint
from epp.testing.waiting import until
from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.kv_events import BlockStored, KVEventBatch
from epp_sim.tokens import token_ids
from tests.epp_sim.helpers import engine_config

HASHER = BlockHasher("sha256_cbor", 16, "42")


def test_topics_name_endpoints_by_ip_port_or_a_unique_ip() -> None:
    sub = KVEventSubscriber(
        SubscriberSettings(zmq_endpoint="tcp://*:5557", per_endpoint=False), BlockIndex(10)
    )
    a = make_endpoint(0, address="10.0.0.1", port=8000)
    b0 = make_endpoint(1, address="10.0.0.2", port=8000)
    b1 = make_endpoint(2, address="10.0.0.2", port=8001)
    for ep in (a, b0, b1):
        sub.add(ep)
    assert sub.endpoint_for_topic(b"kv@10.0.0.1@Qwen/Qwen3") == a.metadata.name  # llm-d's kv@<pod-ip>@<model>
    assert sub.endpoint_for_topic(b"kv@10.0.0.2:8001@m") == b1.metadata.name
    assert sub.endpoint_for_topic(b"kv@10.0.0.2@m") is None  # two endpoints there, no rank: unknown
    # a pod's data-parallel ranks share its IP: the batch's rank picks the rank-th port
    for rank, ep in enumerate((b0, b1)):
        batch = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[], data_parallel_rank=rank))
        assert sub.endpoint_for_topic(b"kv@10.0.0.2@m", batch) == ep.metadata.name
    three = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[], data_parallel_rank=2))
    assert sub.endpoint_for_topic(b"kv@10.0.0.2@m", three) is None
    assert sub.endpoint_for_topic(b"kv@10.0.0.9@m") is None
    assert sub.endpoint_for_topic(b"kv") is None


def consistent(state: EndpointState) -> bool:
    return state.consistent


def held(sub: KVEventSubscriber, state: EndpointState, hashes: list[int]) -> Callable[[], bool]:
    """True once the index shows ``state``'s endpoint holding every block of ``hashes``."""
    return lambda: sub.index.match(hashes, 1 << state.slot).get(state.slot, 0) == len(hashes)


def payload(seq_tokens: list[int]) -> bytes:
    stored = BlockStored(
        block_hashes=HASHER.hashes(seq_tokens), parent_block_hash=None, token_ids=seq_tokens,
        block_size=16, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None] * (len(seq_tokens) // 16),
    )  # fmt: skip
    return msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[stored]))


def test_moving_to_the_central_socket_is_a_restart_not_an_outage() -> None:
    sub = KVEventSubscriber(SubscriberSettings(hasher=HASHER, zmq_endpoint="tcp://*:0"), BlockIndex(100))
    ep = make_endpoint(0)
    sub.add(ep)
    name = ep.metadata.name
    state = sub.index.states[name]
    for seq in range(5):  # per-endpoint stream
        sub.on_message(name, seq, payload(list(range(seq * 100, seq * 100 + 32))), now=float(seq))
    # the engine restarts publishing to the EPP's socket: its sequence counts from 0 again
    sub.on_message(name, 0, payload(list(range(1000, 1032))), now=10.0)
    assert consistent(state) and state.restarts == 1 and state.gaps == 0
    assert state.reason == "engine restarted (seq 0)"


async def test_engines_connect_to_the_epps_socket() -> None:
    """Two simulated engines connect to the bound socket (vLLM's rule: no ``*``, connect) and a
    third binds its own (pod discovery): all three are indexed under the right endpoint."""
    sub = KVEventSubscriber(
        SubscriberSettings(hasher=HASHER, zmq_endpoint="tcp://127.0.0.1:0", endpoints={}, per_endpoint=False),
        BlockIndex(10_000),
    )
    await sub.start()
    central = sub.bound_endpoint
    assert central.startswith("tcp://127.0.0.1:") and not central.endswith(":0")
    config = FleetConfig(
        replicas=3,
        engine=engine_config(kv_events=central, prefix_caching_hash_algo="sha256_cbor", hash_seed="42"),
        overrides=({"replica": 2, "kv_events": "tcp://127.0.0.1:0"},),  # this one binds: per endpoint
    )
    try:
        async with Fleet(config) as fleet, aiohttp.ClientSession() as http:
            ranks = [fleet.rank(i) for i in range(3)]
            eps = [make_endpoint(i, address="127.0.0.1", port=r.port) for i, r in enumerate(ranks)]
            bound = ranks[2].publisher
            assert bound is not None
            sub.settings = dataclasses.replace(
                sub.settings, endpoints={eps[2].metadata.hostport: bound.endpoint}
            )
            for ep in eps:
                sub.add(ep)
            states = [sub.index.states[ep.metadata.name] for ep in eps]

            async def complete(i: int, prompt: str) -> None:
                async with http.post(
                    f"{ranks[i].url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}
                ) as r:
                    assert r.status == 200

            for i, state in enumerate(states):  # connections come up asynchronously: probe until heard
                n = 0
                while state.batches == 0:
                    n += 1
                    await complete(i, f"probe {i} {n:04d} " + "p" * 64)
                    await asyncio.sleep(0.05)  # give the probe's batch time to cross before the next
            for i, state in enumerate(states):
                prompt = f"engine {i} system prompt " * 20
                await complete(i, prompt)
                hashes = HASHER.hashes(token_ids(prompt).tolist())
                await until(held(sub, state, hashes))
                others = [o for o in states if o is not state]
                assert all(sub.index.match(hashes, 1 << o.slot).get(o.slot, 0) == 0 for o in others)
            assert all(consistent(s) for s in states) and sub.unattributed == 0
            assert sub.debug_state()["centralEndpoint"] == central
    finally:
        await sub.stop()
