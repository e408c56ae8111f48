"""p2p-source-producer: upstream's vectors (requestcontrol/dataproducer/p2psource/producer_test.go
at ebab68792) and the header through the real director: a repeated prompt scheduled on another
pod names the pod that cached it."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.director.producers.p2p_source import (
    KV_CACHE_SOURCE_HEADER,
    BestMatchPeer,
    P2PSourceProducer,
    P2PSourceProducerParams,
    spread_fraction,
)
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.plugins import FakeHandle

BLOCK = 16  # upstream's testBlockSize


def _producer(**params: object) -> P2PSourceProducer:
    return P2PSourceProducer("test", P2PSourceProducerParams.model_validate(params), FakeHandle())


def _ep(address: str, waiting: int = 0) -> Endpoint:
    md = EndpointMetadata(name=f"default/{address}", address=address, port=8080)
    return Endpoint(md, Metrics(waiting_queue_size=waiting))


def _state(*cached: tuple[Endpoint, int]) -> CycleState:
    state = CycleState()
    for ep, blocks in cached:
        state.put_attribute(PREFIX_MATCH, ep, PrefixMatchInfo(blocks, 4, BLOCK))
    return state


def _request(request_id: str, headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest(request_id=request_id, target_model="m", body=None, headers=headers or {})


async def _best(p: P2PSourceProducer, request_id: str, *cached: tuple[Endpoint, int]) -> BestMatchPeer | None:
    state = _state(*cached)
    await p.prepare_request_data(state, _request(request_id), [ep for ep, _ in cached])
    return state.get(p.best_key)


def test_params() -> None:
    """Defaults (delta 1, profile prefill), wiring, and a delta below 1 refused."""
    assert (_producer().min_cached_token_delta, _producer().prefill_profile) == (1, "prefill")
    p = _producer(prefixMatchInfoProducerName="precise", minCachedTokenDelta=33, prefillProfileName="P")
    assert (p.min_cached_token_delta, p.prefill_profile) == (33, "P")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        _producer(minCachedTokenDelta=0)


async def test_stashes_the_most_cached_peer() -> None:
    best = await _best(_producer(), "req-stash", (_ep("10.0.0.1"), 1), (_ep("10.0.0.2"), 3))
    assert best == BestMatchPeer("10.0.0.2:8080", 48)


async def test_no_cached_blocks_no_stash_and_missing_info_is_zero() -> None:
    p = _producer()
    assert await _best(p, "req-nocache", (_ep("10.0.0.1"), 0), (_ep("10.0.0.2"), 0)) is None
    bare, cached = _ep("10.0.0.9"), _ep("10.0.0.2")
    state = _state((cached, 2))
    await p.prepare_request_data(state, _request("req-bare"), [bare, cached])
    best = state.get(p.best_key)
    assert best is not None and best.hostport == "10.0.0.2:8080"


async def test_ipv6_is_bracketed() -> None:
    best = await _best(_producer(), "req-ipv6-produce", (_ep("fd00::9"), 2))
    assert best is not None and best.hostport == "[fd00::9]:8080"


async def test_beyond_the_band_wins_over_idle() -> None:
    """A peer more than one block ahead wins regardless of load."""
    best = await _best(_producer(), "req-strict", (_ep("10.0.0.1", 20), 5), (_ep("10.0.0.2", 0), 3))
    assert best == BestMatchPeer("10.0.0.1:8080", 5 * BLOCK)


async def _picks(p: P2PSourceProducer, prefix: str, n: int, *cached: tuple[Endpoint, int]) -> dict[str, int]:
    picks: dict[str, int] = {}
    for i in range(n):
        best = await _best(p, f"{prefix}-{i}", *cached)
        assert best is not None
        picks[best.hostport] = picks.get(best.hostport, 0) + 1
    return picks


async def test_shares_by_inverse_queue_weight() -> None:
    """Equally cached peers share pulls by 1/(1+queue): weights 1/13, 1/3, 1/8."""
    a, b, c = _ep("10.0.0.1", 12), _ep("10.0.0.2", 2), _ep("10.0.0.3", 7)
    picks = await _picks(_producer(), "req", 400, (a, 3), (b, 3), (c, 3))
    assert picks["10.0.0.2:8080"] > picks["10.0.0.3:8080"] > picks["10.0.0.1:8080"] > 0


async def test_near_tie_does_not_herd() -> None:
    picks = await _picks(_producer(), "near", 600, (_ep("10.0.0.1", 0), 3), (_ep("10.0.0.2", 1), 3))
    idle, busy = picks["10.0.0.1:8080"], picks["10.0.0.2:8080"]
    assert idle > busy > 600 // 6


async def test_one_block_short_shares_by_queue_with_its_own_count() -> None:
    p = _producer()
    ahead, short = _ep("10.0.0.1", 20), _ep("10.0.0.2", 0)
    counts: dict[str, set[int]] = {}
    for i in range(400):
        best = await _best(p, f"band-{i}", (ahead, 4), (short, 3))
        assert best is not None
        counts.setdefault(best.hostport, set()).add(best.cached_tokens)
    assert counts == {"10.0.0.1:8080": {4 * BLOCK}, "10.0.0.2:8080": {3 * BLOCK}}
    picks = await _picks(p, "band", 400, (ahead, 4), (short, 3))
    assert picks["10.0.0.2:8080"] > picks["10.0.0.1:8080"] > 0


async def test_equal_peers_spread_by_request_id_deterministically() -> None:
    eps = [(_ep(f"10.0.0.{i}"), 3) for i in (1, 2, 3)]
    assert len(await _picks(_producer(), "req", 64, *eps)) == 3
    assert await _best(_producer(), "req-7", *eps) == await _best(_producer(), "req-7", *eps)


def test_spread_fraction_is_fnv1a() -> None:
    """FNV-1a 32: the empty string hashes to the offset basis; "a" to 0xe40c292c."""
    assert spread_fraction("") == 0x811C9DC5 / 2**32
    assert spread_fraction("a") == 0xE40C292C / 2**32


def _result(**profiles: Endpoint) -> SchedulingResult:
    return SchedulingResult(
        profile_results={name: ProfileRunResult((ep,)) for name, ep in profiles.items()},
        primary_profile_name="decode",
    )


@pytest.mark.parametrize(
    ("best", "delta", "cached", "prefill", "want"),
    [
        pytest.param(("10.0.0.2:8080", 48), 1, {"10.0.0.1": 1}, None, "10.0.0.2:8080", id="sets-header"),
        pytest.param(("10.0.0.2:8080", 32), 17, {"10.0.0.1": 1}, None, None, id="delta-below-threshold"),
        pytest.param(("10.0.0.1:8080", 32), 1, {"10.0.0.1": 2}, None, None, id="best-is-chosen"),
        pytest.param(
            ("10.0.0.2:8080", 48), 1, {"10.0.0.1": 0, "10.0.0.2": 3}, "prefill", None, id="best-is-prefill"
        ),
        pytest.param(
            ("10.0.0.3:8080", 64),
            1,
            {"10.0.0.1": 0, "10.0.0.2": 1},
            "prefill",
            "10.0.0.3:8080",
            id="third-pod",
        ),
        pytest.param(("[fd00::2]:8080", 48), 1, {"fd00::1": 1}, None, "[fd00::2]:8080", id="ipv6"),
    ],
)
def test_pre_request(
    best: tuple[str, int], delta: int, cached: dict[str, int], prefill: str | None, want: str | None
) -> None:
    """Upstream's PreRequest vectors: the computing pod is the prefill target when there is one."""
    p = _producer(minCachedTokenDelta=delta)
    eps = {address: _ep(address) for address in cached}
    state = _state(*((eps[a], n) for a, n in cached.items()))
    state.put(p.best_key, BestMatchPeer(*best))
    addresses = list(cached)
    profiles = {"decode": eps[addresses[0]]}
    if prefill is not None:
        profiles[prefill] = eps[addresses[1]]
    request = _request("r")
    p.pre_request(state, request, _result(**profiles))
    mutation = request.header_mutation
    got = None if mutation is None else mutation.set.get(KV_CACHE_SOURCE_HEADER)
    assert got == want


def test_configured_prefill_profile_name() -> None:
    p = _producer(prefillProfileName="P")
    a, b = _ep("10.0.0.1"), _ep("10.0.0.2")
    state = _state((a, 0), (b, 3))
    state.put(p.best_key, BestMatchPeer("10.0.0.2:8080", 48))
    request = _request("r")
    p.pre_request(state, request, _result(decode=a, P=b))
    assert request.header_mutation is None


def test_inbound_header_is_removed() -> None:
    """A client's header is stripped even with no best match stashed."""
    p = _producer()
    request = _request("req-spoof", {KV_CACHE_SOURCE_HEADER: "evil:1234"})
    p.pre_request(CycleState(), request, _result(decode=_ep("10.0.0.1")))
    assert KV_CACHE_SOURCE_HEADER not in request.headers
    assert request.header_mutation is not None
    assert request.header_mutation.remove == [KV_CACHE_SOURCE_HEADER]
    assert KV_CACHE_SOURCE_HEADER not in request.header_mutation.set


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: p2p-source-producer
- type: header-based-testing-filter
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


async def test_through_the_director_the_repeat_on_another_pod_names_the_cached_one() -> None:
    """A prompt served by pod A and then pinned (conformance header) to pod B: B is told to pull from A."""
    components = build(load_config(CONFIG), default_registry(entry_points=False), BuildOptions())
    assert any(isinstance(p, P2PSourceProducer) for p in components.producers)
    assert any(isinstance(p, P2PSourceProducer) for p in components.pre_request)
    ds = Datastore()
    for i in (1, 2):
        ds.upsert(EndpointMetadata(name=f"default/pod-{i}", address=f"10.0.0.{i}", port=8000))
    director = Director(
        ds, components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    )
    body = orjson.dumps({"model": "m", "prompt": "a long shared system prompt " * 60, "max_tokens": 1})
    first = await director.start({"test-epp-endpoint-selection": "10.0.0.1:8000"}, {}).route(body)
    assert first.destination == "10.0.0.1:8000"
    assert KV_CACHE_SOURCE_HEADER not in dict(first.headers)
    second = await director.start(
        {"test-epp-endpoint-selection": "10.0.0.2:8000", KV_CACHE_SOURCE_HEADER: "evil:1"}, {}
    ).route(body)
    assert second.destination == "10.0.0.2:8000"
    assert dict(second.headers)[KV_CACHE_SOURCE_HEADER] == "10.0.0.1:8000"
    assert KV_CACHE_SOURCE_HEADER in second.remove_headers
