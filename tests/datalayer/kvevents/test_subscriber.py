"""The subscriber's view of an event stream: sequence gaps, restarts, clears, silence, mismatches,
replay; first message by message (no sockets), then over ZMQ against the simulator."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import pytest

from epp.datalayer.kvevents import metrics as m
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.testing.builders import make_endpoint
from epp.testing.waiting import until
from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from epp_sim.tokens import token_ids
from tests.epp_sim.helpers import engine_config

HASHER = BlockHasher("sha256_cbor", 16, "42")
TOKENS = list(range(64))
HASHES = HASHER.hashes(TOKENS)


def stored(
    hashes: list[int], *, parent: int | None = None, tokens: list[int] | None = None, bs: int = 16
) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens if tokens is not None else TOKENS[: 16 * len(hashes)],
        block_size=bs,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


def payload(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> bytes:
    return msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=list(events)))


def subscriber(**settings: object) -> tuple[KVEventSubscriber, int]:
    sub = KVEventSubscriber(SubscriberSettings(hasher=HASHER, **settings), BlockIndex(1000))  # type: ignore[arg-type]
    ep = make_endpoint(0)
    sub.add(ep)
    return sub, sub.index.states[ep.metadata.name].slot


NAME = make_endpoint(0).metadata.name


def held(sub: KVEventSubscriber, slot: int) -> int:
    return sub.index.match(HASHES, 1 << slot).get(slot, 0)


async def test_in_sequence_join_late_and_gap_without_replay() -> None:
    sub, slot = subscriber()
    state = sub.index.states[NAME]
    assert not state.consistent  # nothing seen yet
    assert sub.on_message(NAME, 7, payload(stored(HASHES[:2]))) is None  # joining late is fine
    assert (state.consistent, held(sub, slot)) == (True, 2)
    assert sub.on_message(NAME, 8, payload(stored(HASHES[2:3], parent=HASHES[1]))) is None
    assert held(sub, slot) == 3
    gap = sub.on_message(NAME, 11, payload(BlockRemoved(block_hashes=[HASHES[2]], medium="GPU")))
    assert gap == 9
    assert (state.consistent, state.gaps) == (False, 1)
    await sub._recover(NAME, None, 9, 11, payload(BlockRemoved(block_hashes=[HASHES[2]], medium="GPU")))
    assert (state.consistent, held(sub, slot), state.last_seq) == (False, 0, 11)  # dropped: may be stale
    assert state.rebuilding
    sub.on_message(NAME, 12, payload(stored(HASHES[:1])))
    assert (state.consistent, held(sub, slot)) == (False, 1)  # fresh events alone miss the hot prefixes
    sub.on_message(NAME, 13, payload(AllBlocksCleared(), stored(HASHES[:2])))
    assert (state.consistent, state.rebuilding, held(sub, slot)) == (True, False, 2)  # a clear + fresh events


def test_restart_clear_and_silence() -> None:
    sub, slot = subscriber(silence_timeout=5.0)
    state = sub.index.states[NAME]
    sub.on_message(NAME, 0, payload(stored(HASHES[:3])), now=1.0)
    sub.on_message(NAME, 1, payload(), now=2.0)
    sub.on_message(NAME, 0, payload(stored(HASHES[:1])), now=3.0)  # seq went back: a new engine
    assert (state.restarts, state.consistent, held(sub, slot)) == (1, True, 1)
    sub.on_message(NAME, 1, payload(AllBlocksCleared()), now=4.0)
    assert (state.clears, held(sub, slot), state.consistent) == (1, 0, True)
    sub.note_routed(NAME, 10.0)
    sub.check_silence(14.0)
    assert (state.consistent, state.reason) == (True, "engine cleared its cache")
    sub.check_silence(15.5)
    assert not state.consistent and state.reason.startswith("silent publisher: no events for 5s after")
    sub.on_message(NAME, 2, payload(stored(HASHES[:2])), now=16.0)
    assert (state.consistent, held(sub, slot)) == (True, 2)


def test_block_size_and_hash_scheme_mismatches_are_loud_and_sticky() -> None:
    before = m.KV_EVENT_MISMATCHES.labels(NAME, "block_size").value
    sub, _ = subscriber()
    state = sub.index.states[NAME]
    sub.on_message(NAME, 0, payload(stored([1], tokens=list(range(32)), bs=32)))
    assert not state.consistent and "block_size mismatch" in state.reason
    assert m.KV_EVENT_MISMATCHES.labels(NAME, "block_size").value == before + 1
    sub.on_message(NAME, 1, payload(stored(HASHES[:1])))
    assert not state.consistent  # a configuration error does not heal itself

    sub2, slot2 = subscriber()
    state2 = sub2.index.states[NAME]
    pickle_hasher = BlockHasher("sha256", 16, "42")  # the engine hashes with pickle
    for seq in range(3):
        tokens = [seq * 1000 + t for t in range(32)]
        sub2.on_message(NAME, seq, payload(stored(pickle_hasher.hashes(tokens), tokens=tokens)))
        if seq < 2:
            assert state2.consistent  # one failure could be a salt the events do not show
    assert not state2.consistent and "hash_scheme mismatch" in state2.reason
    assert held(sub2, slot2) == 0


def test_salted_first_blocks_verify_with_the_engines_extra_keys() -> None:
    """A cache_salt changes the first block's hash; with the engine's extra_keys the check passes,
    without them a failure after a success is not taken for a wrong scheme."""
    sub, slot = subscriber()
    state = sub.index.states[NAME]
    salted = HASHER.hashes(TOKENS, cache_salt="tenant-a")
    event = stored(salted[:2])
    event.extra_keys = [("tenant-a",), None]
    sub.on_message(NAME, 0, payload(event))
    assert (state.verified, state.verify_failures) == (1, 0)
    for seq in range(1, 5):  # salted, extra_keys not sent (older vLLM)
        sub.on_message(NAME, seq, payload(stored(salted[:1])))
    assert state.consistent and state.verify_failures == 4 and state.mismatches == 0
    assert held(sub, slot) == 0  # the salted chain is not the unsalted request's


async def test_gap_replayed_from_the_simulator_over_zmq() -> None:
    """Live events from a simulated engine fill the index with the request's own hashes; a dropped
    batch is a gap, recovered through the engine's replay socket without losing consistency for long."""
    config = FleetConfig(
        engine=engine_config(
            kv_events="tcp://127.0.0.1:0",
            kv_events_replay="tcp://127.0.0.1:0",
            prefix_caching_hash_algo="sha256_cbor",
            hash_seed="42",
        )
    )
    async with Fleet(config) as fleet, aiohttp.ClientSession() as http:
        rank = fleet.rank(0)
        assert rank.publisher is not None and rank.publisher.replay_endpoint is not None
        ep = make_endpoint(0, address="127.0.0.1", port=rank.port)
        settings = SubscriberSettings(
            endpoints={ep.metadata.hostport: rank.publisher.endpoint},
            replay_endpoints={ep.metadata.hostport: rank.publisher.replay_endpoint},
            hasher=HASHER,
        )
        sub = KVEventSubscriber(settings, BlockIndex(10_000))
        sub.add(ep)
        await sub.start()
        state = sub.index.states[ep.metadata.name]

        async def complete(prompt: str) -> None:
            async with http.post(f"{rank.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
                assert r.status == 200

        try:
            n = 0
            while state.batches == 0:  # the subscription reaches the publisher asynchronously
                n += 1
                await complete(f"warm-up {n:04d} " + "w" * 64)
                await asyncio.sleep(0.05)
            prompt = "shared system prompt " * 20
            await complete(prompt)
            hashes = HASHER.hashes(token_ids(prompt).tolist())
            await until(lambda: sub.index.match(hashes, 1 << state.slot).get(state.slot, 0) == len(hashes))
            await fleet.set_faults(kv_events_drop=1)
            await complete("dropped on the wire " * 10)
            await complete("after the gap " * 10)
            await until(lambda: state.gaps == 1 and state.replays == 1 and state.consistent)
            dropped = HASHER.hashes(token_ids("dropped on the wire " * 10).tolist())
            assert sub.index.match(dropped, 1 << state.slot).get(state.slot, 0) == len(dropped)  # replayed
        finally:
            await sub.stop()


@pytest.mark.parametrize("labels", [{}, {"kv-events.epp/port": "6000", "kv-events.epp/topic": "kv@x"}])
def test_addresses_from_settings_and_labels(labels: dict[str, str]) -> None:
    sub = KVEventSubscriber(SubscriberSettings(replay_port=5558), BlockIndex(10))
    ep = make_endpoint(2, labels=labels)
    address, replay, topic = sub.address(ep)
    assert address == f"tcp://192.168.1.3:{labels.get('kv-events.epp/port', '5557')}"
    assert replay == "tcp://192.168.1.3:5558"
    assert topic == labels.get("kv-events.epp/topic", "kv@")


def test_removed_endpoint_leaves_no_series() -> None:
    sub, _ = subscriber()
    sub.on_message(NAME, 0, payload(stored(HASHES[:1])))
    sub.on_message(NAME, 5, payload())  # a gap
    assert (NAME,) in dict(m.KV_EVENT_GAPS._series())
    sub.remove(make_endpoint(0))
    assert (NAME,) not in dict(m.KV_EVENT_GAPS._series())
    assert (NAME,) not in dict(m.KV_EVENT_BATCHES._series())
    assert NAME not in sub.index.states
