"""burst-prefix-cache-producer: the window, what it publishes, its parameters (plugin_test.go's
vectors), and a burst routed through the real director with the upstream sample config."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.datastore.store import Datastore
from epp.director.api import TimeoutAwareProducer
from epp.director.dag import producer_timeout
from epp.director.director import Director
from epp.director.pipeline import DEFAULT_PRODUCER_TIMEOUT
from epp.director.producers.burst_prefix import (
    BurstPrefixCacheProducer,
    block_hashes,
)
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.testing.builders import chat_body, completions_body, make_endpoint
from epp.testing.plugins import build
from tests.scheduling.builders import request

CORPUS = Path(__file__).resolve().parents[2] / "config" / "corpus"


def producer(**params: Any) -> BurstPrefixCacheProducer:
    p: BurstPrefixCacheProducer = build(BurstPrefixCacheProducer, **params)
    return p


def tokenized(ids: Sequence[int]) -> InferenceRequest:
    body = completions_body("text")
    body.token_ids = list(ids)
    return request(body=body)


def fresh(n: int) -> list[Endpoint]:
    """Each request's own endpoint objects, as upstream's tests give each its own snapshot."""
    return [make_endpoint(i) for i in range(n)]


def assigned(state: CycleState, eps: Sequence[Endpoint]) -> str:
    infos = state.attributes(PREFIX_MATCH)
    assert set(infos) == set(eps), "every candidate gets a PrefixMatchInfo"
    hits = [ep.metadata.name for ep in eps if infos[ep].match_blocks > 0]
    assert len(hits) <= 1
    return hits[0] if hits else ""


async def run(p: BurstPrefixCacheProducer, req: InferenceRequest, eps: list[Endpoint]) -> CycleState:
    state = CycleState()
    await p.prepare_request_data(state, req, eps)
    return state


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"windowDurationMs": 0}, "windowDurationMs"),
        ({"windowDurationMs": 10001}, "windowDurationMs"),
        ({"maxPerReplica": 0}, "maxPerReplica"),
        ({"blockSizeTokens": 0}, "blockSizeTokens"),
        ({"maxPrefixTokensToMatch": -1}, "maxPrefixTokensToMatch"),
        ({"maxPrefixTokensToMatch": 32}, "maxPrefixTokensToMatch (32) must be 0 or >= blockSizeTokens (64)"),
        ({"minColocateBlocks": -1}, "minColocateBlocks"),
        ({"maxBatchSize": 0}, "maxBatchSize"),
    ],
)
def test_bad_parameters_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        producer(**params)


def test_balance_by_is_requests_or_tokens() -> None:
    with pytest.raises(ValueError, match="balanceBy"):
        producer(balanceBy="bogus")
    assert producer(balanceBy="").by_tokens is False
    assert producer(balanceBy="tokens").by_tokens is True


def test_defaults_and_timeout() -> None:
    p = producer()
    assert (p.window, p.k, p.block_size, p.max_blocks, p.min_colocate, p.max_batch) == (
        0.1, -1, 64, 2048, 0, 1000,
    )  # fmt: skip
    assert p.produce_timeout() == pytest.approx(0.4)
    assert producer(maxPrefixTokensToMatch=640).max_blocks == 10
    assert producer(windowDurationMs=2000).produce_timeout() == pytest.approx(2.3)
    assert isinstance(p, TimeoutAwareProducer)  # the director reads it
    assert producer_timeout(producer(windowDurationMs=2000), DEFAULT_PRODUCER_TIMEOUT) == pytest.approx(2.3)


async def test_identical_prompt_burst_colocates() -> None:
    p = producer(windowDurationMs=50, blockSizeTokens=4, maxBatchSize=-1)
    eps = [fresh(4) for _ in range(8)]
    states = await asyncio.gather(*(run(p, tokenized([1, 2, 3, 4, 5, 6, 7, 8]), e) for e in eps))
    names = {assigned(s, e) for s, e in zip(states, eps, strict=True)}
    assert len(names) == 1 and "" not in names
    info = states[0].attributes(PREFIX_MATCH)[eps[0][0]]
    assert info == PrefixMatchInfo(2, 2, 4)  # a full match on the assigned replica: 8 ids, 4 a block
    assert p.debug_state()["steered"] == 8


async def test_singleton_has_no_affinity() -> None:
    p = producer(windowDurationMs=20, blockSizeTokens=4)
    eps = fresh(2)
    state = await run(p, tokenized([1, 2, 3, 4]), eps)
    assert assigned(state, eps) == ""
    assert state.attributes(PREFIX_MATCH)[eps[0]] == PrefixMatchInfo(0, 1, 4)


async def test_cancelled_before_seal_writes_nothing() -> None:
    p = producer(windowDurationMs=10000, blockSizeTokens=4)
    state = CycleState()
    task = asyncio.ensure_future(p.prepare_request_data(state, tokenized([1, 2, 3, 4]), fresh(2)))
    await asyncio.sleep(0)  # one loop turn: the task runs until it waits for the window
    assert p.debug_state()["waiting"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not state.attributes(PREFIX_MATCH)


async def test_second_window_after_seal() -> None:
    p = producer(windowDurationMs=20, blockSizeTokens=4)

    async def window(prompt: list[int]) -> set[str]:
        eps = [fresh(3) for _ in range(4)]
        states = await asyncio.gather(*(run(p, tokenized(prompt), e) for e in eps))
        return {assigned(s, e) for s, e in zip(states, eps, strict=True)}

    first = await window([1, 2, 3, 4, 5, 6, 7, 8])
    assert p._batch is None, "sealing detaches the window: the next request opens a new one"
    second = await window([9, 10, 11, 12, 13, 14, 15, 16])
    assert len(first) == len(second) == 1 and "" not in first | second
    assert p.debug_state()["windowsSealed"] == 2


async def test_full_window_refuses_the_request() -> None:
    p = producer(windowDurationMs=20, maxBatchSize=2)
    first = [asyncio.ensure_future(run(p, tokenized([1] * 64), fresh(2))) for _ in range(2)]
    await asyncio.sleep(0)  # one loop turn: both tasks run until they wait for the window
    assert p.debug_state()["waiting"] == 2
    with pytest.raises(RuntimeError, match="maxBatchSize 2"):
        await run(p, tokenized([1] * 64), fresh(2))
    await asyncio.gather(*first)
    assert p.debug_state()["rejectedBatchFull"] == 1


def test_hashes_follow_token_ids_else_text() -> None:
    a, b = tokenized([1] * 130), tokenized([1] * 128 + [2, 2])
    ha, hb = block_hashes(a, 64, 2048), block_hashes(b, 64, 2048)
    assert len(ha) == 3  # two full blocks and a partial one, as upstream
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    assert block_hashes(tokenized([5]), 64, 2048) != ()  # a short prompt is one partial block
    assert len(block_hashes(tokenized([1] * 1000), 64, 3)) == 3  # maxPrefixTokensToMatch's cap
    system = {"role": "system", "content": "s" * 600}
    c1 = request(body=chat_body([system, {"role": "user", "content": "one"}]))
    c2 = request(body=chat_body([system, {"role": "user", "content": "two"}]))
    h1, h2 = block_hashes(c1, 16, 2048), block_hashes(c2, 16, 2048)
    assert h1[:5] == h2[:5] and h1 != h2  # the shared system prompt is a shared prefix
    other_model = request(body=chat_body([system]), model="other")
    assert block_hashes(other_model, 16, 2048)[0] != h1[0]  # the chain starts from the model


async def test_sample_config_routes_a_burst_to_one_replica() -> None:
    """The upstream sample config, through the real director: a burst of one prompt's samples
    lands on one replica, while a second prompt's burst in the same window goes elsewhere."""
    components = build_components(
        load_config_file(CORPUS / "llmd-router-v0.10.0--epp-burst-prefix-cache-config.yaml"),
        default_registry(),
    )
    ds = Datastore()
    for i in range(4):
        ds.upsert(make_endpoint(i).metadata)
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    director = Director(ds, pipeline)

    async def route(prompt: str) -> str:
        body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5})
        decision = await director.start({}, {}).route(body)
        return decision.destination

    try:
        a, b = "rollout prompt A " * 40, "rollout prompt B " * 40
        got = await asyncio.gather(*(route(a) for _ in range(6)), *(route(b) for _ in range(6)))
    finally:
        for plugin in components.lifecycle:
            await plugin.stop()
    assert len(set(got[:6])) == 1
    assert len(set(got[6:])) == 1
    assert got[0] != got[6]
