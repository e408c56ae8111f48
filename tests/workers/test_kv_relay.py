"""``--workers N`` with a centralised ``zmqEndpoint``: worker 0 binds it and relays to its siblings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import RELAY_ENV, KVEventSubscriber, SubscriberSettings
from epp.testing.builders import make_endpoint
from tests.datalayer.kvevents.test_central import HASHER, held, payload


async def test_siblings_index_what_engines_publish_to_worker_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = f"ipc://{tmp_path / 'kv.pub'}"
    settings = SubscriberSettings(hasher=HASHER, zmq_endpoint="tcp://127.0.0.1:0", per_endpoint=False)
    ep = make_endpoint(0, address="127.0.0.1", port=8000)
    subs = []
    for mode in ("bind", "connect"):  # worker 0, then worker 1 (both would bind without the relay)
        monkeypatch.setenv(RELAY_ENV, f"{mode}:{relay}")
        sub = KVEventSubscriber(settings, BlockIndex(1000))
        sub.add(ep)
        await sub.start()
        subs.append(sub)
    primary, sibling = subs
    assert sibling.bound_endpoint == relay
    ctx = zmq.asyncio.Context()
    engine = ctx.socket(zmq.PUB)
    engine.connect(primary.bound_endpoint)  # an engine connects to the EPP's address, as vLLM does
    try:
        tokens = list(range(64))
        states = [s.index.states[ep.metadata.name] for s in subs]
        async with asyncio.timeout(10):
            seq = 0
            while not all(s.batches for s in states):  # ZMQ's slow joiners: publish until both hear
                await engine.send_multipart([b"kv@127.0.0.1:8000@m", seq.to_bytes(8, "big"), payload(tokens)])
                seq += 1
                await asyncio.sleep(0.02)  # pacing the probes, not a wait for a result
        for sub, state in zip(subs, states, strict=True):
            assert held(sub, state, HASHER.hashes(tokens))()
    finally:
        engine.close(linger=0)
        ctx.term()
        for sub in subs:
            await sub.stop()
