"""approx-prefix-cache-producer: hashing, matching, LRU bounds, eviction, endpoint removal, metrics."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import xxhash

from epp.datalayer.api import Endpoint, EndpointObserver
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.director.api import DataProducer, PreRequest
from epp.director.prefix.hashing import hash_request, user_input_bytes
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.errors import ConfigError
from epp.metrics.series import REGISTRY
from epp.plugin.registry import Registry
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest, RequestBody
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.builders import chat_body, completions_body
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.builders import endpoint, request

BLOCK = 16 * 4  # default blockSizeTokens x 4 characters per token


def reference_hashes(
    data: bytes, model: str, salt: str = "", block: int = BLOCK, max_blocks: int = 256
) -> list[int]:
    """The chained block hashes written the obvious way (xxh64 chained through the seed), to check
    the optimised loop against."""
    if len(data) < block:
        return []
    data = data[: block * max_blocks]
    prev = xxhash.xxh64((model + salt).encode()).intdigest()
    out = []
    for i in range(0, len(data), block):
        prev = xxhash.xxh64(data[i : i + block], seed=prev).intdigest()
        out.append(prev)
    return out


def _producer(**params: Any) -> ApproxPrefixCacheProducer:
    p: ApproxPrefixCacheProducer = build(ApproxPrefixCacheProducer, **params)
    return p


def _prepare(p: ApproxPrefixCacheProducer, req: InferenceRequest, eps: list[Endpoint]) -> CycleState:
    state = CycleState()
    p.prepare(state, req, eps)
    return state


def _schedule_to(
    p: ApproxPrefixCacheProducer,
    state: CycleState,
    req: InferenceRequest,
    target: Endpoint,
    prefill: Endpoint | None = None,
) -> None:
    results: dict[str, ProfileRunResult | None] = {"default": ProfileRunResult((target,))}
    if prefill is not None:
        results["prefill"] = ProfileRunResult((prefill,))
    p.pre_request(state, req, SchedulingResult(profile_results=results, primary_profile_name="default"))


def _matches(state: CycleState, eps: list[Endpoint]) -> list[tuple[int, int]]:
    out = []
    for ep in eps:
        info = state.attribute(PREFIX_MATCH, ep)
        assert info is not None
        out.append((info.match_blocks, info.total_blocks))
    return out


@pytest.mark.parametrize(
    ("length", "salt", "max_blocks"),
    [
        pytest.param(BLOCK * 3, "", 256, id="three-full-blocks"),
        pytest.param(BLOCK * 3 + 10, "", 256, id="trailing-partial-block"),
        pytest.param(BLOCK - 1, "", 256, id="shorter-than-a-block"),
        pytest.param(BLOCK * 10, "", 4, id="truncated-to-max-blocks"),
        pytest.param(BLOCK * 2, "tenant-a", 256, id="with-cache-salt"),
        pytest.param(100_000, "", 256, id="long-prompt-capped"),
    ],
)
def test_hashes_match_reference(length: int, salt: str, max_blocks: int) -> None:
    """The chained xxh64 block hashes equal a straightforward reference computation."""
    prompt = "".join(chr(ord("a") + i % 26) for i in range(length))
    body = completions_body(prompt)
    body.cache_salt = salt
    req = request(model="m1", body=body)
    assert hash_request(req, 16, max_blocks) == reference_hashes(
        prompt.encode(), "m1", salt, max_blocks=max_blocks
    )


def test_model_and_salt_change_hashes() -> None:
    """The same prompt hashes differently under another model or cache_salt, so they never match."""
    prompt = "x" * (BLOCK * 2)
    base = hash_request(request(model="a", body=completions_body(prompt)), 16, 256)
    other_model = hash_request(request(model="b", body=completions_body(prompt)), 16, 256)
    salted_body = completions_body(prompt)
    salted_body.cache_salt = "s"
    salted = hash_request(request(model="a", body=salted_body), 16, 256)
    assert len(base) == 2
    assert not set(base) & set(other_model)
    assert not set(base) & set(salted)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            chat_body(
                [
                    {"role": "system", "content": "sys", "name": "x"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                ]
            ),
            orjson.dumps(
                [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                ]
            ),
            id="chat-keeps-role-and-content",
        ),
        pytest.param(chat_body([{"content": "c"}]), b'[{"content":"c"}]', id="chat-no-role"),
        pytest.param(completions_body("plain"), b"plain", id="completions-string"),
        pytest.param(completions_body(["a", "b", "c"]), b"a b c", id="completions-list-joined"),
        pytest.param(completions_body([1, 2, 3]), b"", id="completions-token-ids-empty"),
        pytest.param(
            RequestBody(api=ApiKind.EMBEDDINGS, raw=b"", json={"input": ["q1", "q2"]}),
            b'["q1","q2"]',
            id="embeddings",
        ),
        pytest.param(
            RequestBody(api=ApiKind.RESPONSES, raw=b"", json={"instructions": "be brief", "input": "hello"}),
            b'[{"instructions":"be brief"},{"input":"hello"}]',
            id="responses",
        ),
        pytest.param(
            RequestBody(api=ApiKind.CONVERSATIONS, raw=b"", json={"items": [{"type": "message"}]}),
            b'[{"type":"message"}]',
            id="conversations",
        ),
        pytest.param(
            RequestBody(
                api=ApiKind.MESSAGES,
                raw=b"",
                json={"system": "S", "messages": [{"role": "user", "content": "u"}]},
            ),
            b'[{"role":"system","content":"S"},{"role":"user","content":"u"}]',
            id="anthropic-messages-system-first",
        ),
        pytest.param(
            RequestBody(api=ApiKind.GRPC_GENERATE, raw=b"", prompt_text="txt"), b"txt", id="grpc-text"
        ),
        pytest.param(
            RequestBody(api=ApiKind.GRPC_GENERATE, raw=b"", token_ids=[1, 258]),
            b"\x01\x00\x00\x00\x02\x01\x00\x00",
            id="grpc-token-ids-le32",
        ),
        pytest.param(RequestBody(api=ApiKind.RAW, raw=b"anything"), b"", id="raw-nothing"),
    ],
)
def test_user_input_bytes(body: RequestBody, expected: bytes) -> None:
    """Per-API user input, as GIE extracts it (plus our Anthropic and gRPC rules)."""
    assert user_input_bytes(body) == expected


def test_match_walk_and_pre_request_learning() -> None:
    """After routing to pod-1, a request sharing the prefix matches on pod-1 only, up to the divergence."""
    p = _producer(autoTune=False)
    eps = [endpoint(0), endpoint(1), endpoint(2)]
    first = request(body=completions_body("A" * (BLOCK * 4)))
    state = _prepare(p, first, eps)
    assert _matches(state, eps) == [(0, 4)] * 3
    _schedule_to(p, state, first, eps[1])

    second = request(body=completions_body("A" * (BLOCK * 2) + "B" * (BLOCK * 3)))
    state2 = _prepare(p, second, eps)
    assert _matches(state2, eps) == [(0, 5), (2, 5), (0, 5)]
    info = state2.attribute(PREFIX_MATCH, eps[1])
    assert info == PrefixMatchInfo(2, 5, 16)


def test_debug_state_hit_rate_counts_blocks_held_by_the_picked_endpoint() -> None:
    """Cold, then a shared prefix routed to the endpoint that holds it, then elsewhere."""
    p = _producer(autoTune=False)
    eps = [endpoint(0), endpoint(1)]
    assert p.debug_state()["hitRate"] == {
        "requests": 0,
        "requestsWithHit": 0,
        "blocksLookedUp": 0,
        "blocksHit": 0,
        "ratio": None,
    }
    first = request(body=completions_body("A" * (BLOCK * 4)))
    _schedule_to(p, _prepare(p, first, eps), first, eps[0])  # cold: 0 of 4
    second = request(body=completions_body("A" * (BLOCK * 2) + "B" * (BLOCK * 2)))
    _schedule_to(p, _prepare(p, second, eps), second, eps[0])  # 2 of 4 on the picked pod-0
    third = request(body=completions_body("A" * (BLOCK * 4)))
    _schedule_to(p, _prepare(p, third, eps), third, eps[1])  # pod-0 held 4, but pod-1 was picked

    hits = p.debug_state()["hitRate"]
    assert hits == {
        "requests": 3,
        "requestsWithHit": 1,
        "blocksLookedUp": 12,
        "blocksHit": 2,
        "ratio": round(2 / 12, 4),
    }


def test_prefill_profile_target_recorded() -> None:
    """PreRequest records the hashes on the primary target and on the first target of profile 'prefill'."""
    p = _producer(autoTune=False)
    eps = [endpoint(0), endpoint(1), endpoint(2)]
    req = request(body=completions_body("P" * (BLOCK * 3)))
    state = _prepare(p, req, eps)
    _schedule_to(p, state, req, eps[0], prefill=eps[2])
    again = _prepare(p, req, eps)
    assert _matches(again, eps) == [(3, 3), (0, 3), (3, 3)]


def test_lru_capacity_bounds_memory_and_eviction_prunes_reverse_index() -> None:
    """lruCapacityPerServer bounds each endpoint's entries; evicted hashes leave the reverse index."""
    p = _producer(autoTune=False, lruCapacityPerServer=5)
    ep = endpoint(0)
    reqs = [request(body=completions_body(chr(ord("a") + i) * (BLOCK * 3))) for i in range(4)]
    for r in reqs:
        state = _prepare(p, r, [ep])
        _schedule_to(p, state, r, ep)
    assert p.index.server_size(ep.metadata.name) == 5
    assert len(p.index) == 5
    assert p.index.reverse_size == 5
    # The newest request's 3 blocks and the last 2 of the one before survive (LRU order).
    assert _matches(_prepare(p, reqs[3], [ep]), [ep]) == [(3, 3)]
    assert _matches(_prepare(p, reqs[0], [ep]), [ep]) == [(0, 3)]
    first_block_of_2 = hash_request(reqs[2], 16, 256)[0]
    assert p.index.holders(first_block_of_2) == set()
    assert p.index.holders(hash_request(reqs[2], 16, 256)[1]) == {ep.metadata.name}


def test_capacity_from_engine_blocks_when_autotuned() -> None:
    """With autoTune, cache_num_blocks is the LRU capacity and cache_block_size the block size."""
    p = _producer(lruCapacityPerServer=1000)
    ep = endpoint(0, block_size=8, num_blocks=4)
    req = request(body=completions_body("z" * (8 * 4 * 10)))
    state = _prepare(p, req, [ep])
    info = state.attribute(PREFIX_MATCH, ep)
    assert info is not None
    assert (info.total_blocks, info.block_size_tokens) == (10, 8)
    _schedule_to(p, state, req, ep)
    assert p.index.server_size(ep.metadata.name) == 4


def test_endpoint_removal_drops_entries() -> None:
    """endpoint_removed forgets that endpoint's entries and reverse-index bits; others keep theirs."""
    p = _producer(autoTune=False)
    eps = [endpoint(0), endpoint(1)]
    for ep in eps:
        p.endpoint_added(ep)
    req = request(body=completions_body("R" * (BLOCK * 2)))
    state = _prepare(p, req, eps)
    _schedule_to(p, state, req, eps[0])
    _schedule_to(p, state, req, eps[1])
    assert p.index.holders(hash_request(req, 16, 256)[0]) == {eps[0].metadata.name, eps[1].metadata.name}
    p.endpoint_removed(eps[0])
    assert p.index.server_size(eps[0].metadata.name) == 0
    assert p.index.holders(hash_request(req, 16, 256)[0]) == {eps[1].metadata.name}
    assert len(p.index) == 2
    p.endpoint_removed(eps[1])
    assert len(p.index) == 0
    assert p.index.reverse_size == 0
    # A late PreRequest for a removed endpoint does not resurrect its entries.
    _schedule_to(p, state, req, eps[0])
    assert len(p.index) == 0


def test_slots_are_recycled() -> None:
    """A new endpoint reuses a freed slot, and does not inherit the old one's entries."""
    p = _producer(autoTune=False)
    old, new = endpoint(0), endpoint(1)
    req = request(body=completions_body("S" * BLOCK))
    state = _prepare(p, req, [old])
    _schedule_to(p, state, req, old)
    p.index.remove_server(old.metadata.name)
    assert _matches(_prepare(p, req, [new]), [new]) == [(0, 1)]
    _schedule_to(p, _prepare(p, req, [new]), req, new)
    assert p.index.holders(hash_request(req, 16, 256)[0]) == {new.metadata.name}


@pytest.mark.parametrize(
    ("params", "length", "total"),
    [
        pytest.param({"maxPrefixBlocksToMatch": 3}, BLOCK * 10, 3, id="max-blocks"),
        pytest.param({"maxPrefixTokensToMatch": 64}, BLOCK * 10, 4, id="max-tokens-overrides-blocks"),
        pytest.param({"maxPrefixBlocksToMatch": 0}, BLOCK * 10, 0, id="zero-blocks-no-hashing"),
        pytest.param({"blockSizeTokens": 32}, BLOCK * 10, 5, id="bigger-blocks"),
    ],
)
def test_block_limits(params: dict[str, Any], length: int, total: int) -> None:
    """Block limits and sizes from the parameters decide total_blocks."""
    p = _producer(autoTune=False, **params)
    ep = endpoint(0)
    state = _prepare(p, request(body=completions_body("q" * length)), [ep])
    assert _matches(state, [ep]) == [(0, total)]


def test_no_body_or_short_prompt_gives_zero_totals() -> None:
    """A header-only request or a prompt under one block yields total 0 for every endpoint."""
    p = _producer()
    eps = [endpoint(0), endpoint(1)]
    assert _matches(_prepare(p, request(), eps), eps) == [(0, 0), (0, 0)]
    assert _matches(_prepare(p, request(body=completions_body("hi")), eps), eps) == [(0, 0), (0, 0)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"blockSize": 64, "blockSizeTokens": 0},
            r"invalid configuration: BlockSize \(64\) is deprecated; please use BlockSizeTokens instead",
            id="deprecated-block-size",
        ),
        pytest.param(
            {"autoTune": False, "blockSizeTokens": 0},
            r"BlockSizeTokens must be > 0 when AutoTune is disabled \(current value: 0\)",
            id="no-block-size",
        ),
        pytest.param(
            {"maxPrefixTokensToMatch": -1},
            r"MaxPrefixTokensToMatch must be >= 0 \(current value: -1\)",
            id="neg-tokens",
        ),
        pytest.param(
            {"maxPrefixBlocksToMatch": -2},
            r"MaxPrefixBlocksToMatch must be >= 0 \(current value: -2\)",
            id="neg-blocks",
        ),
        pytest.param(
            {"lruCapacityPerServer": 0},
            r"LRUCapacityPerServer must be > 0 \(current value: 0\)",
            id="zero-capacity",
        ),
    ],
)
def test_validation(params: dict[str, Any], message: str) -> None:
    """Invalid parameter combinations fail at build time with GIE's wording."""
    with pytest.raises(ConfigError, match=message):
        _producer(**params)


def test_registry_builds_with_camel_case_params() -> None:
    """The registry validates GIE's parameter names and yields a producer, pre-request hook and observer."""
    reg = Registry([ApproxPrefixCacheProducer])
    p = reg.build(
        name="prefix",
        type_name="approx-prefix-cache-producer",
        parameters={
            "autoTune": False,
            "blockSizeTokens": 8,
            "maxPrefixBlocksToMatch": 10,
            "lruCapacityPerServer": 7,
        },
        handle=FakeHandle(),
        path="plugins[0]",
    )
    assert isinstance(p, DataProducer)
    assert isinstance(p, PreRequest)
    assert isinstance(p, EndpointObserver)
    assert isinstance(p, ApproxPrefixCacheProducer)
    assert (p.block_size_tokens, p.max_prefix_blocks, p.lru_capacity) == (8, 10, 7)
    with pytest.raises(ConfigError, match=r"plugins\[0\]\.parameters\.lruCapacity"):
        reg.build(
            name="x",
            type_name="approx-prefix-cache-producer",
            parameters={"lruCapacity": 1},
            handle=FakeHandle(),
            path="plugins[0]",
        )


async def test_prepare_request_data_async_and_metrics() -> None:
    """The async hook writes attributes; PreRequest records hit bytes/ratio and the indexer size."""
    p = _producer(autoTune=False)
    eps = [endpoint(0), endpoint(1)]
    req = request(body=completions_body("M" * (BLOCK * 4)))
    state = CycleState()
    await p.prepare_request_data(state, req, eps)
    _schedule_to(p, state, req, eps[0])
    count_before = REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_ratio_count") or 0.0
    sum_before = REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_bytes_sum") or 0.0
    state2 = CycleState()
    await p.prepare_request_data(state2, req, eps)
    _schedule_to(p, state2, req, eps[0])
    assert (
        REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_ratio_count") or 0.0
    ) == count_before + 1
    hit_bytes = (
        REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_bytes_sum") or 0.0
    ) - sum_before
    assert hit_bytes == 4 * BLOCK
    assert REGISTRY.get_sample_value("inference_extension_prefix_indexer_size") == len(p.index) == 4
    p.endpoint_removed(eps[0])  # read at the scrape: no request has to set it
    assert REGISTRY.get_sample_value("inference_extension_prefix_indexer_size") == len(p.index) == 0


async def test_auto_tuned_hit_bytes_count_the_picked_endpoints_block_size() -> None:
    """Auto-tuned, the hit bytes use the engine block size of the endpoint the request went to
    (the hashing used the first candidate's), as ``block_size(primary.target_endpoints)``."""
    p = _producer()
    eps = [endpoint(0, block_size=16), endpoint(1, block_size=32)]
    req = request(body=completions_body("M" * (BLOCK * 4)))
    state = CycleState()
    await p.prepare_request_data(state, req, eps)
    _schedule_to(p, state, req, eps[1])
    sum_before = REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_bytes_sum") or 0.0
    state2 = CycleState()
    await p.prepare_request_data(state2, req, eps)
    _schedule_to(p, state2, req, eps[1])
    hit_bytes = (
        REGISTRY.get_sample_value("inference_extension_prefix_indexer_hit_bytes_sum") or 0.0
    ) - sum_before
    assert hit_bytes == 4 * (32 * 4)  # 4 blocks of 16 tokens hashed, counted at 32 tokens of 4 chars


def test_shared_info_objects() -> None:
    """Endpoints without a match share one PrefixMatchInfo object (no per-endpoint allocation)."""
    p = _producer(autoTune=False)
    eps = [endpoint(i) for i in range(5)]
    state = _prepare(p, request(body=completions_body("s" * BLOCK * 2)), eps)
    infos = [state.attribute(PREFIX_MATCH, e) for e in eps]
    assert all(i is infos[0] for i in infos)
