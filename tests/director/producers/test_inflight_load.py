"""inflight-load-producer: token estimate, counting, exact release, endpoint removal, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointObserver
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.datastore.store import Datastore
from epp.director.api import DataProducer, PreRequest, ResponseCompleteProcessor, ResponseHeaderProcessor
from epp.director.director import Director, Pipeline
from epp.director.producers.inflight_load import IDLE, InFlightLoadProducer
from epp.errors import EppError, Internal
from epp.parsers.plugins.openai import OpenAIParser
from epp.plugin.base import NoParams, PluginParams, TypedName
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import ApiKind, InferenceRequest, RequestBody, ResponseInfo, estimate_tokens
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint


def producer() -> InFlightLoadProducer:
    p: InFlightLoadProducer = build(InFlightLoadProducer)
    return p


def req(*, size: int = 0, prompt: str | None = None, token_ids: list[int] | None = None) -> InferenceRequest:
    body = RequestBody(api=ApiKind.COMPLETIONS, raw=b"", json={}, prompt_text=prompt, token_ids=token_ids)
    return InferenceRequest(request_id="r", headers={}, body=body, request_size_bytes=size)


def result(*profiles: tuple[str, Sequence[Endpoint] | None], primary: str = "default") -> SchedulingResult:
    runs = {name: None if eps is None else ProfileRunResult(tuple(eps)) for name, eps in profiles}
    return SchedulingResult(runs, primary)


def load(p: InFlightLoadProducer, ep: Endpoint) -> tuple[int, int]:
    v = p.load_of(ep)
    return v.requests, v.tokens


def response(*, eos: bool = True) -> ResponseInfo:
    return ResponseInfo(request_id="r", end_of_stream=eos)


@pytest.mark.parametrize(
    ("inference_request", "expected"),
    [
        pytest.param(req(size=16), 4 + 6, id="size-16-bytes"),
        pytest.param(req(size=3), 1 + 2, id="size-below-4-is-one-token"),
        pytest.param(req(size=41), 10 + 15, id="size-floors"),
        pytest.param(req(size=12), 3 + 5, id="output-rounds-half-up"),
        pytest.param(req(prompt="1234567890123456"), 4 + 6, id="gie-test-prompt"),
        pytest.param(req(prompt="ab"), 1 + 2, id="prompt-rounds-half-up"),
        pytest.param(req(prompt="abcde"), 1 + 2, id="prompt-rounds-down"),
        pytest.param(req(prompt="é" * 4), 2 + 3, id="prompt-counts-utf8-bytes"),
        pytest.param(req(prompt=""), 1 + 2, id="empty-prompt-is-one-token"),
        pytest.param(req(token_ids=[1, 2, 3, 4, 5]), 5 + 8, id="token-ids"),
        pytest.param(InferenceRequest(request_id="r", headers={}), 0, id="no-body"),
    ],
)
def test_estimate_tokens(inference_request: InferenceRequest, expected: int) -> None:
    """GIE's estimate: in = bytes/4 (else token ids, else prompt/4, min 1); total = in + round(1.5 in)."""
    assert estimate_tokens(inference_request) == expected


def test_implements_its_hooks() -> None:
    """One plugin is producer, PreRequest, header and completion hook, and endpoint observer."""
    p = producer()
    for proto in (
        DataProducer,
        PreRequest,
        ResponseHeaderProcessor,
        ResponseCompleteProcessor,
        EndpointObserver,
    ):
        assert isinstance(p, proto)
    assert frozenset({INFLIGHT_LOAD}) == InFlightLoadProducer.PRODUCES


def test_prepare_writes_every_candidate() -> None:
    """Each candidate gets its current load; endpoints never used read as idle."""
    p = producer()
    a, b, c = endpoint(0), endpoint(1), endpoint(2)
    p.pre_request(CycleState(), req(size=16), result(("default", [a, b])))
    p.pre_request(CycleState(), req(size=16), result(("default", [a])))
    state = CycleState()
    p.prepare(state, [a, b, c])
    assert dict(state.attributes(INFLIGHT_LOAD)) == {
        a: InFlightLoad(requests=2, tokens=20),
        b: IDLE,
        c: IDLE,
    }
    assert p.inflight_load(a) == InFlightLoad(2, 20)
    assert p.inflight_load(b) is None


async def test_prepare_request_data_is_the_async_entry() -> None:
    """The DataProducer hook writes the same attributes."""
    p = producer()
    a = endpoint(0)
    p.pre_request(CycleState(), req(size=16), result(("default", [a])))
    state = CycleState()
    await p.prepare_request_data(state, req(), [a])
    assert state.attribute(INFLIGHT_LOAD, a) == InFlightLoad(1, 10)


@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        pytest.param([("default", [0, 1])], {0: (1, 10)}, id="only-first-endpoint"),
        pytest.param([("default", [0]), ("prefill", [1])], {0: (1, 10), 1: (1, 10)}, id="each-profile"),
        pytest.param([("a", [0]), ("b", [0])], {0: (2, 20)}, id="same-endpoint-twice"),
        pytest.param([("default", [0]), ("failed", None)], {0: (1, 10)}, id="failed-profile-skipped"),
        pytest.param([("default", [0]), ("empty", [])], {0: (1, 10)}, id="empty-profile-skipped"),
    ],
)
def test_pre_request_counts(
    profiles: list[tuple[str, list[int] | None]], expected: dict[int, tuple[int, int]]
) -> None:
    """Every profile's first endpoint gets +1 request and the request's token estimate."""
    p = producer()
    eps = [endpoint(i) for i in range(2)]
    runs = [(name, None if idx is None else [eps[i] for i in idx]) for name, idx in profiles]
    state = CycleState()
    p.pre_request(state, req(size=16), result(*runs))
    assert {i: load(p, eps[i]) for i in range(2) if load(p, eps[i]) != (0, 0)} == expected
    p.response_complete(state, req(size=16), response(), eps[0])
    assert [load(p, ep) for ep in eps] == [(0, 0), (0, 0)]


@pytest.mark.parametrize("eos", [pytest.param(True, id="normal"), pytest.param(False, id="abnormal")])
def test_completion_releases_exactly_once(eos: bool) -> None:
    """Completion (normal or not) undoes exactly this request's additions; a repeat is a no-op."""
    p = producer()
    a = endpoint(0)
    other = CycleState()
    p.pre_request(other, req(size=400), result(("default", [a])))
    state = CycleState()
    p.pre_request(state, req(size=16), result(("default", [a])))
    assert load(p, a) == (2, 250 + 10)
    p.response_complete(state, req(size=16), response(eos=eos), a)
    assert load(p, a) == (1, 250)
    p.response_complete(state, req(size=16), response(eos=eos), a)
    assert load(p, a) == (1, 250)


def test_completion_without_pre_request_is_a_no_op() -> None:
    """A request that was never scheduled releases nothing."""
    p = producer()
    a = endpoint(0)
    p.pre_request(CycleState(), req(size=16), result(("default", [a])))
    p.response_complete(CycleState(), req(size=16), response(), a)
    assert load(p, a) == (1, 10)


def test_prefill_released_when_response_starts() -> None:
    """The prefill endpoint is released at the response headers, the decode endpoint at completion."""
    p = producer()
    decode, prefill = endpoint(0), endpoint(1)
    state = CycleState()
    p.pre_request(state, req(size=16), result(("default", [decode]), ("prefill", [prefill])))
    assert (load(p, decode), load(p, prefill)) == ((1, 10), (1, 10))
    p.response_header(state, req(size=16), response(eos=False), decode)
    assert (load(p, decode), load(p, prefill)) == ((1, 10), (0, 0))
    p.response_header(state, req(size=16), response(eos=False), decode)
    assert (load(p, decode), load(p, prefill)) == ((1, 10), (0, 0))
    p.response_complete(state, req(size=16), response(), decode)
    assert (load(p, decode), load(p, prefill)) == ((0, 0), (0, 0))


def test_prefill_released_at_completion_without_response() -> None:
    """Without response headers (abnormal end), completion releases the prefill endpoint too."""
    p = producer()
    decode, prefill = endpoint(0), endpoint(1)
    state = CycleState()
    p.pre_request(state, req(size=16), result(("default", [decode]), ("prefill", [prefill])))
    p.response_complete(state, req(size=16), response(eos=False), None)
    assert (load(p, decode), load(p, prefill)) == ((0, 0), (0, 0))


def test_removed_endpoint_drops_counters_and_in_flight_release_stays_detached() -> None:
    """Removal forgets the counters; a request still in flight there never touches the new endpoint."""
    p = producer()
    a = endpoint(0)
    p.endpoint_added(a)
    old = CycleState()
    p.pre_request(old, req(size=16), result(("default", [a])))
    p.endpoint_removed(a)
    assert p.inflight_load(a) is None
    again = endpoint(0)  # same name, e.g. the pod moved
    p.endpoint_added(again)
    new = CycleState()
    p.pre_request(new, req(size=400), result(("default", [again])))
    p.response_complete(old, req(size=16), response(), a)
    assert load(p, again) == (1, 250)
    p.response_complete(new, req(size=400), response(), again)
    assert load(p, again) == (0, 0)


def test_endpoint_removed_before_pre_request_is_not_recreated() -> None:
    """With the datastore wired, PreRequest for an endpoint already gone leaves no counter behind."""
    p = producer()
    a, b = endpoint(0), endpoint(1)
    p.endpoint_added(a)
    p.endpoint_added(b)
    p.endpoint_removed(b)
    state = CycleState()
    p.pre_request(state, req(size=16), result(("default", [b])))
    assert p.inflight_load(b) is None
    p.response_complete(state, req(size=16), response(), b)
    assert p.inflight_load(b) is None


def test_without_observer_every_endpoint_is_counted() -> None:
    """Without datastore wiring, endpoints get counters on first use."""
    p = producer()
    b = endpoint(1)
    p.pre_request(CycleState(), req(size=16), result(("default", [b])))
    assert p.inflight_load(b) == InFlightLoad(1, 10)


# --- many concurrent requests through the director ---------------------------------------


class _RandomPick:
    """Picks a random candidate (seeded); with ``pd``, a second random one as ``prefill``."""

    def __init__(self, rng: random.Random, pd: bool) -> None:
        self.rng = rng
        self.pd = pd

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        runs: dict[str, ProfileRunResult | None] = {
            "default": ProfileRunResult((self.rng.choice(candidates),))
        }
        if self.pd:
            runs["prefill"] = ProfileRunResult((self.rng.choice(candidates),))
        return SchedulingResult(runs, "default")


class _Yield:
    """A producer that yields to the loop, so requests interleave inside ``route``."""

    TYPE: ClassVar[str] = "yield"
    PARAMS: ClassVar[type[PluginParams]] = NoParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    typed_name = TypedName("yield", "yield")

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> None:
        await asyncio.sleep(0)


@pytest.mark.parametrize("pd", [pytest.param(False, id="single"), pytest.param(True, id="prefill-decode")])
async def test_concurrent_requests_with_abnormal_ends(pd: bool) -> None:
    """200 interleaved requests ending normally, mid-response or before it: the counters always
    equal what is open, never go negative, and return to zero."""
    rng = random.Random(7)
    p = producer()
    ds = Datastore()
    ds.add_observer(p)
    eps = [ds.upsert(endpoint(i).metadata) for i in range(3)]
    director = Director(
        ds,
        Pipeline(
            parser=build(OpenAIParser),
            scheduler=_RandomPick(rng, pd),
            admission=AlwaysAdmit(),
            producers=(_Yield(), p),
            pre_request=(p,),
            response_header=(p,),
            response_complete=(p,),
        ),
        rng=rng,
    )
    open_requests: dict[str, int] = {ep.metadata.name: 0 for ep in eps}
    open_tokens: dict[str, int] = {ep.metadata.name: 0 for ep in eps}

    def check() -> None:
        for ep in eps:
            requests, tokens = load(p, ep)
            assert requests >= 0
            assert tokens >= 0
            assert (requests, tokens) == (open_requests[ep.metadata.name], open_tokens[ep.metadata.name])

    def account(held: list[tuple[str, int]], sign: int) -> None:
        for name, tokens in held:
            open_requests[name] += sign
            open_tokens[name] += sign * tokens

    async def one(i: int) -> None:
        ending = rng.choice(("normal", "abnormal-mid-response", "abnormal-before-response", "error"))
        body = orjson.dumps({"model": "m", "prompt": "x" * rng.randrange(1, 400)})
        lc = director.start({":path": "/v1/completions"}, {})
        await lc.route(body)
        ctx = lc.ctx
        assert ctx.result is not None
        tokens = estimate_tokens(ctx.request)
        held = [
            (run.target_endpoints[0].metadata.name, tokens)
            for run in ctx.result.profile_results.values()
            if run is not None
        ]
        prefill = ctx.result.profile_results.get("prefill")
        account(held, +1)
        check()
        await asyncio.sleep(0)
        if ending == "abnormal-before-response":
            lc.close(None)
            account(held, -1)
            check()
            return
        lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
        if prefill is not None:
            account([(prefill.target_endpoints[0].metadata.name, tokens)], -1)
            held.remove((prefill.target_endpoints[0].metadata.name, tokens))
        check()
        await asyncio.sleep(0)
        if ending == "normal":
            lc.response_chunk(b'{"usage":{"prompt_tokens":1,"completion_tokens":1}}', True)
        error: EppError | None = Internal("stream broke") if ending == "error" else None
        lc.close(error)
        account(held, -1)
        check()

    await asyncio.gather(*(one(i) for i in range(200)))
    check()
    assert all(load(p, ep) == (0, 0) for ep in eps)


# --- Appendix A #7: the concurrency detector sees real load ----------------------------------

DETECTOR_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: concurrency-detector
    parameters:
      maxConcurrency: 2
  - type: queue-scorer
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
saturationDetector:
  pluginRef: concurrency-detector
"""


def test_concurrency_detector_reads_live_load() -> None:
    """The auto-added producer is the detector's load source, so pool saturation is not always 0."""
    components = build_config(load_config(DETECTOR_CONFIG), default_registry(entry_points=False))
    p = components.plugins["inflight-load-producer"]
    assert isinstance(p, InFlightLoadProducer)
    detector = components.saturation_detector
    a, b = endpoint(0), endpoint(1)
    assert detector.saturation([a, b]) == 0.0
    state = CycleState()
    p.pre_request(state, req(size=16), result(("default", [a])))
    p.pre_request(CycleState(), req(size=16), result(("default", [a])))
    assert detector.saturation([a, b]) == 2 / 4
    p.response_complete(state, req(size=16), response(), a)
    assert detector.saturation([a, b]) == 1 / 4


def test_a_counters_view_is_an_ordinary_frozen_in_flight_load() -> None:
    """The view is built through the slots' setters, not the dataclass's ``__init__``: it must be
    the same value (equal, same hash, same repr) and as frozen."""
    p = build(InFlightLoadProducer)
    a = endpoint(0)
    state = CycleState()
    req = InferenceRequest(request_id="r", headers={}, request_size_bytes=400)
    p.pre_request(state, req, result(("default", [a])))
    view = p.load_of(a)
    want = InFlightLoad(requests=1, tokens=estimate_tokens(req))
    assert view == want and hash(view) == hash(want) and repr(view) == repr(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.tokens = 0  # type: ignore[misc]
