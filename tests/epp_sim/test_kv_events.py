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

from epp_sim.config import FleetConfig, SimConfigError
from epp_sim.fleet import Fleet
from epp_sim.kv_events import offset_endpoint
from epp_sim.rank import Rank
from epp_sim.tokens import token_ids
from tests.epp_sim.helpers import engine_config


# vLLM's own definitions (vllm/distributed/kv_events.py after vllm#42892: maps, not arrays), kept
# apart from the simulator's on purpose
class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


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


async def test_raw_payload_is_tagged_maps(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """Without any struct definitions the payload is {ts, events: [{type, fields...}], data_parallel_rank}
    (vllm#42892), fields at their default left out."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(engine=engine_config(kv_events="tcp://127.0.0.1:0", lora_modules=("sql",)))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        await complete(http, rank.url, "x" * 64, model="sql")
        frames = await asyncio.wait_for(sub.socket.recv_multipart(), 5)
    batch = msgspec.msgpack.decode(frames[2])
    (event,) = batch["events"]
    assert isinstance(batch["ts"], float)
    assert batch["data_parallel_rank"] == 0
    assert event["type"] == "BlockStored"
    assert len(event["block_hashes"]) == 1  # 64 characters: 16 tokens, one block
    assert event["parent_block_hash"] is None
    assert (event["block_size"], event["lora_id"], event["medium"], event["lora_name"]) == (
        16,
        1,
        "GPU",
        "sql",
    )
    assert "group_idx" not in event


async def test_eviction_and_crash_events(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """Evicting cached blocks publishes BlockRemoved for exactly those hashes; POST /reset_prefix_cache
    publishes AllBlocksCleared; a crash publishes nothing and the restarted engine counts from 0."""
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
        async with http.post(f"{rank.url}/reset_prefix_cache") as response:
            assert response.status == 200
        cleared = await sub.drain()
        await fleet.set_faults(crashed=True)
        after_crash = await sub.drain()
        await fleet.set_faults(crashed=False)
        await complete(http, rank.url, "c" * 128)
        await sub.drain()
    assert after_crash == []
    assert sub.seqs[-1] == 0  # a new engine process: its publisher starts again at 0
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


def vllm_reference_hashes(tokens: list[int], block_size: int, algo: str, seed: str) -> list[int]:
    """vLLM's hash_block_tokens / init_none_hash / maybe_convert_block_hash, written out here from
    vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py (sha256 = pickle, *_cbor = canonical CBOR)."""
    import hashlib
    import pickle

    import cbor2

    def serialise(value: Any) -> bytes:
        if algo.endswith("_cbor"):
            return bytes(cbor2.dumps(value, canonical=True))
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def fn(value: Any) -> bytes:
        return hashlib.sha256(serialise(value)).digest()

    parent = fn(seed)  # NONE_HASH with PYTHONHASHSEED set
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = fn((parent, tuple(tokens[start : start + block_size]), None))
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
async def test_published_hashes_are_vllms(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession, algo: str
) -> None:
    """The block hashes in BlockStored are vLLM's for the configured algorithm and seed."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(
        engine=engine_config(kv_events="tcp://127.0.0.1:0", prefix_caching_hash_algo=algo, hash_seed="42")
    )
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        await complete(http, rank.url, prompt)
        (stored,) = [e for e in await sub.drain() if isinstance(e, BlockStored)]
    expected = vllm_reference_hashes(token_ids(prompt).tolist(), 16, algo, "42")
    assert stored.block_hashes == expected


async def test_dropped_batch_is_a_gap_and_replayable(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """The kv_events_drop fault skips a sequence number on the wire; the ROUTER replay socket still
    serves the dropped batch, then the end marker, as vLLM's publisher does."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(
        engine=engine_config(kv_events="tcp://127.0.0.1:0", kv_events_replay="tcp://127.0.0.1:0")
    )
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None and rank.publisher.replay_endpoint is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        before = sub.seqs[-1]
        await fleet.set_faults(kv_events_drop=1)
        await complete(http, rank.url, "x" * 128)
        await complete(http, rank.url, "y" * 128)
        await sub.drain()
        dealer = zmq_context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(rank.publisher.replay_endpoint)
        await dealer.send_multipart((b"", (before + 1).to_bytes(8, "big")))
        replayed = []
        while True:
            _, seq, payload = await asyncio.wait_for(dealer.recv_multipart(), 5)
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert payload == b""
                break
            replayed.append(int.from_bytes(seq, "big"))
        dealer.close()
    assert before + 1 not in sub.seqs  # the gap
    assert before + 2 in sub.seqs
    assert replayed[:2] == [before + 1, before + 2]


async def test_tokenize_endpoint_is_vllms(http: aiohttp.ClientSession) -> None:
    """POST /tokenize answers as vLLM: prompt or chat messages (rendered with the chat template)."""
    from epp_sim.tokens import render_chat

    config = FleetConfig(engine=engine_config(max_model_len=4096))
    messages = [{"role": "user", "content": "hello there"}]
    async with Fleet(config) as fleet:
        url = fleet.rank(0).url
        async with http.post(f"{url}/tokenize", json={"prompt": "abcdefgh"}) as response:
            prompt_body = await response.json()
        async with http.post(f"{url}/tokenize", json={"messages": messages}) as response:
            chat_body = await response.json()
        async with http.post(f"{url}/tokenize", json={"prompt": 3}) as response:
            assert response.status == 400
    assert prompt_body == {
        "count": 2,
        "max_model_len": 4096,
        "tokens": token_ids("abcdefgh").tolist(),
        "token_strs": None,
    }
    assert chat_body["tokens"] == token_ids(render_chat(messages)).tolist()


async def test_cache_salt_is_hashed_into_the_first_block(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """As vLLM, a request's cache_salt is an extra key of its first block only."""
    from epp.datalayer.kvevents.hashing import BlockHasher

    sub = Subscriber(zmq_context)
    config = FleetConfig(
        engine=engine_config(
            kv_events="tcp://127.0.0.1:0", prefix_caching_hash_algo="sha256_cbor", hash_seed="5"
        )
    )
    prompt = "salted prompt text " * 8
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        await complete(http, rank.url, prompt, cache_salt="tenant-a")
        (stored,) = [e for e in await sub.drain() if isinstance(e, BlockStored)]
    ids = token_ids(prompt).tolist()
    hasher = BlockHasher("sha256_cbor", 16, "5")
    assert stored.block_hashes == hasher.hashes(ids, cache_salt="tenant-a")
    assert stored.block_hashes[0] != hasher.hashes(ids)[0]


async def test_restart_under_another_hash_algo_and_seed(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """Setting restart_hash_algo / restart_hash_seed restarts the engine (sequence numbers from 0)
    and its blocks hash as vLLM's under the new algorithm and seed (a rolling upgrade)."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(
        engine=engine_config(
            kv_events="tcp://127.0.0.1:0", prefix_caching_hash_algo="sha256_cbor", hash_seed="42"
        )
    )
    prompt = "A rolling upgrade changes the hash. " * 4
    tokens = token_ids(prompt).tolist()
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        assert rank.publisher.seq > 0
        await fleet.set_faults(restart_hash_algo="sha256", restart_hash_seed="7")
        assert rank.publisher.seq == 0  # a new engine process: its connections were reset too
        sub.seqs.clear()
        async with aiohttp.ClientSession() as after:
            await complete(after, rank.url, prompt)
        (stored,) = [e for e in await sub.drain() if isinstance(e, BlockStored)]
        assert sub.seqs[0] == 0
        assert stored.block_hashes == vllm_reference_hashes(tokens, 16, "sha256", "7")
        await fleet.set_faults(restart_hash_algo="", restart_hash_seed=None)  # back as configured
        async with aiohttp.ClientSession() as after:
            await complete(after, rank.url, prompt)
        (stored,) = [e for e in await sub.drain() if isinstance(e, BlockStored)]
        assert stored.block_hashes == vllm_reference_hashes(tokens, 16, "sha256_cbor", "42")
        with pytest.raises(SimConfigError, match="restart_hash_algo"):
            await fleet.set_faults(restart_hash_algo="md5")


async def test_silent_publisher_serves_but_sends_nothing(
    zmq_context: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    """kv_events_silent: the engine still serves (and numbers its batches), nothing reaches a
    subscriber; cleared, the next batch shows the sequence numbers it skipped."""
    sub = Subscriber(zmq_context)
    config = FleetConfig(engine=engine_config(kv_events="tcp://127.0.0.1:0"))
    async with Fleet(config) as fleet:
        rank = fleet.rank(0)
        assert rank.publisher is not None
        sub.socket.connect(rank.publisher.endpoint)
        await connected(sub, http, rank.url)
        before = rank.publisher.seq
        await fleet.set_faults(kv_events_silent=True)
        await complete(http, rank.url, "served while silent " * 8)
        assert await sub.drain() == []
        assert rank.publisher.seq > before
        await fleet.set_faults(kv_events_silent=False)
        await complete(http, rank.url, "heard again " * 8)
        assert [e for e in await sub.drain() if isinstance(e, BlockStored)]
        assert sub.seqs[-1] > before
