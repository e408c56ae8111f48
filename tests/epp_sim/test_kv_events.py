"""Tests of KV-cache events over ZMQ: vLLM's wire format, topic, sequence numbers and event content."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.kv_events import offset_endpoint
from epp_sim.rank import Rank
from epp_sim.tokens import token_ids
from tests.epp_sim.helpers import engine_config


# vLLM's own definitions (vllm/distributed/kv_events.py), kept apart from the simulator's on purpose
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class Subscriber:
    """A SUB socket collecting [topic, seq, batch] messages."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.setsockopt(zmq.LINGER, 0)
        self.seqs: list[int] = []

    async def next(self, wait_s: float = 5.0) -> tuple[bytes, KVEventBatch]:
        frames = await asyncio.wait_for(self.socket.recv_multipart(), wait_s)
        topic, seq, payload = frames
        assert len(seq) == 8
        self.seqs.append(int.from_bytes(seq, "big"))
        return topic, DECODER.decode(payload)

    async def drain(self) -> list[Any]:
        """Every event until the publisher has been quiet for 0.2 s."""
        events: list[Any] = []
        while True:
            try:
                events += (await self.next(wait_s=0.2))[1].events
            except TimeoutError:
                return events


_probe = itertools.count()


async def complete(http: aiohttp.ClientSession, url: str, prompt: str, **extra: Any) -> None:
    async with http.post(
        url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, **extra}
    ) as response:
        assert response.status == 200
        await response.read()


async def connected(sub: Subscriber, http: aiohttp.ClientSession, url: str) -> None:
    """Send probe requests until the subscriber receives events (ZMQ drops messages sent before a
    subscription reaches the publisher), then drain what the probes caused."""
    for _ in range(50):
        await complete(http, url, f"probe {next(_probe):06d} " + "p" * 80)
        try:
            await sub.next(wait_s=0.2)
            break
        except TimeoutError:
            continue
    else:
        pytest.fail("no KV event reached the subscriber")
    await sub.drain()


@pytest.fixture
async def zmq_context() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.mark.parametrize("mode", ["bind", "connect"])
async def test_block_stored_wire_format(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession, mode: str
) -> None:
    """A prompt's full blocks arrive as one BlockStored with chained hashes, the prompt's token ids,
    the topic kv@host:port@model, DP rank 0 and consecutive sequence numbers."""
    sub = Subscriber(zmq_context)
    if mode == "connect":  # the EPP binds, every replica connects (llm-d's centralised mode)
        sub.socket.bind("tcp://127.0.0.1:*")
        endpoint = str(sub.socket.getsockopt_string(zmq.LAST_ENDPOINT))
    else:  # each replica binds, the EPP connects
        endpoint = "tcp://127.0.0.1:0"
    config = FleetConfig(engine=engine_config(kv_events=endpoint))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        if mode == "bind":
            sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        prompt = ("Block stored wire format test. " * 9)[:256]  # 64 tokens: 4 full blocks
        await complete(http, rank.url, prompt)
        topic, batch = await sub.next()
        await complete(
            http, rank.url, prompt + "Sixteen more tokens (sixty-four characters) fill one more block."
        )
        _, follow_up = await sub.next()
    assert topic == f"kv@127.0.0.1:{rank.port}@mock-model".encode()
    assert batch.data_parallel_rank == 0
    assert sub.seqs == list(range(sub.seqs[0], sub.seqs[0] + len(sub.seqs)))
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert (len(stored.block_hashes), stored.parent_block_hash, stored.block_size) == (4, None, 16)
    assert stored.token_ids == token_ids(prompt).tolist()
    assert (stored.lora_id, stored.medium, stored.lora_name) == (None, "GPU", None)
    (extension,) = follow_up.events
    assert isinstance(extension, BlockStored)
    assert extension.parent_block_hash == stored.block_hashes[-1]
    assert len(extension.block_hashes) == 1


async def test_raw_payload_is_array_like_and_tagged(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """Without any struct definitions the payload is [ts, [[tag, fields...]], dp_rank]."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(engine=engine_config(kv_events="tcp://127.0.0.1:0", lora_modules=("sql",)))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        await complete(http, rank.url, "x" * 64, model="sql")
        frames = await asyncio.wait_for(sub.socket.recv_multipart(), 5)
    ts, events, dp_rank = msgspec.msgpack.decode(frames[2])
    (event,) = events
    assert isinstance(ts, float)
    assert dp_rank == 0
    assert event[0] == "BlockStored"
    assert event[4:] == [16, 1, "GPU", "sql"]


async def test_eviction_and_crash_events(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """Evicting cached blocks publishes BlockRemoved for exactly those hashes; a crash publishes
    AllBlocksCleared."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(engine=engine_config(kv_events="tcp://127.0.0.1:0", num_gpu_blocks=6))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        await complete(http, rank.url, "a" * 256)  # 64 + 2 tokens: 5 of the 6 blocks, 4 cached
        (first,) = [e for e in await sub.drain() if isinstance(e, BlockStored)]
        await complete(http, rank.url, "b" * 256)  # needs 5 blocks: only one cached block can survive
        events = await sub.drain()
        await fleet.set_faults(crashed=True)
        cleared = await sub.drain()
    removed = {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
    assert set(first.block_hashes[1:]) <= removed
    assert first.block_hashes[0] not in removed  # freed last, so evicted last: the prefix outlives its tail
    assert cleared == [AllBlocksCleared()]


async def test_dp_ranks_publish_on_offset_ports(zmq_context: zmq.asyncio.Context) -> None:
    """Bound endpoints are offset per global rank like vLLM's DP ranks; each batch carries its rank."""
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://epp:5557", 3) == "tcp://epp:5557"  # connecting: no offset
    assert offset_endpoint("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"  # ephemeral stays ephemeral
    config = FleetConfig(dp_size=2, engine=engine_config(kv_events="tcp://127.0.0.1:0"))
    async with Fleet(config) as fleet, aiohttp.ClientSession() as http:
        ranks: list[Rank] = fleet.replicas[0].ranks
        subs = []
        for rank in ranks:
            sub = Subscriber(zmq_context)
            assert rank.publisher is not None
            sub.socket.connect(rank.publisher.endpoint)
            await connected(sub, http, rank.url)
            subs.append(sub)
        batches = []
        for rank, sub in zip(ranks, subs, strict=True):
            await complete(http, rank.url, "d" * 128)
            batches.append((await sub.next())[1])
        endpoints = {r.publisher.endpoint for r in ranks if r.publisher is not None}
    assert [b.data_parallel_rank for b in batches] == [0, 1]
    assert len(endpoints) == 2
