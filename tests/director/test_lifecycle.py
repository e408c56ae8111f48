"""One request's lifecycle: its phases, each step once, and when a response is held."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from epp.datalayer.api import Endpoint
from epp.director.lifecycle import Phase, RequestLifecycle
from epp.director.response import ResponseSide
from epp.errors import Internal, ServiceUnavailable
from epp.plugin.base import TypedName
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from tests.director.test_director import Hooks, body, director, metric


def phase(lc: RequestLifecycle) -> Phase:
    """The phase, read through a call: mypy keeps an asserted ``lc.phase`` narrowed across method calls."""
    return lc.phase


SSE = {":status": "200", "content-type": "text/event-stream"}
JSON = {":status": "200", "content-type": "application/json"}


def running(model: str) -> float:
    return metric("inference_objective_running_requests", model_name=model)


def errors(model: str, code: str) -> float:
    """Errors of ``code`` for ``model``, whatever their reason label."""
    from epp.metrics.series import REGISTRY

    total = 0.0
    for family in REGISTRY.collect():
        for s in family.samples:
            if (
                s.name == "inference_objective_request_error_total"
                and s.labels.get("model_name") == model
                and (s.labels.get("error_code") == code)
            ):
                total += s.value
    return total


async def routed(model: str, hooks: Hooks | None = None, **start: bool) -> RequestLifecycle:
    d, _ = director(hooks=hooks)
    lc = d.start({}, {}, **start)
    assert phase(lc) is Phase.RECEIVING
    await lc.route(body(model))
    return lc


async def test_streamed_response_walks_every_phase_once() -> None:
    """Routed → responding → complete → closed; chunks pass as the same objects; books balance."""
    hooks = Hooks()
    lc = await routed("lc-stream", hooks)
    assert phase(lc) is Phase.ROUTED and lc.scheduled
    assert running("lc-stream") == 1
    added = lc.response_headers(dict(SSE), end_of_stream=False)
    assert added == [("x-added-by-plugin", "yes")]
    assert phase(lc) is Phase.RESPONDING
    chunks = [b"data: {}\n\n", b"data: {}\n\n", b"data: [DONE]\n\n"]
    assert lc.response_chunk(chunks[0], False) is chunks[0]
    assert lc.response_chunk(chunks[1], False) is chunks[1]
    assert not lc.response_metadata  # none yet: written by completion hooks, at the end
    assert lc.response_chunk(chunks[2], True) is chunks[2]
    assert phase(lc) is Phase.COMPLETE
    assert len(hooks.completions) == 1 and hooks.completions[0].end_of_stream
    assert lc.response_metadata == {"envoy.lb": {"x-gateway-inference-request-cost": 10}}
    lc.close()
    lc.close()  # idempotent
    assert phase(lc) is Phase.CLOSED
    assert len(hooks.completions) == 1
    assert running("lc-stream") == 0


async def test_close_with_error_mid_stream_completes_and_counts_once() -> None:
    """The stream dies mid-response: completion hooks still run (not end_of_stream), the error counts once."""
    hooks = Hooks()
    lc = await routed("lc-broken", hooks)
    lc.response_headers(dict(SSE), end_of_stream=False)
    lc.response_chunk(b"data: {}\n\n", False)
    before = errors("lc-broken", "Internal")
    lc.close(Internal("stream broke"))
    lc.close(Internal("again"))
    assert phase(lc) is Phase.CLOSED
    assert len(hooks.completions) == 1 and not hooks.completions[0].end_of_stream
    assert errors("lc-broken", "Internal") == before + 1
    assert running("lc-broken") == 0


async def test_response_chunk_before_headers() -> None:
    """A body without headers is accounted leniently and ends the response normally."""
    hooks = Hooks()
    lc = await routed("lc-headless", hooks)
    chunk = b'{"usage":{}}'
    assert lc.response_chunk(chunk, False) is chunk
    assert phase(lc) is Phase.RESPONDING
    assert lc.ctx.response is not None and lc.ctx.response.body_bytes == len(chunk)
    lc.response_chunk(b"", True)
    assert phase(lc) is Phase.COMPLETE and len(hooks.completions) == 1
    lc.close()


async def test_response_headers_with_end_of_stream_complete_the_response() -> None:
    """A body-less response (HEAD, 204) completes at its headers."""
    hooks = Hooks()
    lc = await routed("lc-empty", hooks)
    lc.response_headers({":status": "204"}, end_of_stream=True)
    assert phase(lc) is Phase.COMPLETE and len(hooks.completions) == 1
    lc.close()
    assert len(hooks.completions) == 1


async def test_headers_only_request_is_not_scheduled() -> None:
    """A GET is routed without counting as running; completion hooks run only if its response ends."""
    hooks = Hooks()
    d, _ = director(hooks=hooks)
    lc = d.start({}, {})
    assert lc.route_headers_only().destination == "192.168.1.2:8000"
    assert phase(lc) is Phase.ROUTED and not lc.scheduled
    lc.close()  # ended before any response: nothing was taken, nothing to release
    assert not hooks.completions

    lc = d.start({}, {})
    lc.route_headers_only()
    lc.response_headers(dict(JSON), end_of_stream=False)
    lc.response_chunk(b"{}", True)
    lc.close()
    assert len(hooks.completions) == 1


async def test_failed_route_stays_receiving_and_closes_with_its_error() -> None:
    """A routing error leaves the request unrouted; closing counts the error, no running gauge."""
    d, _ = director(eps=[])
    lc = d.start({}, {})
    with pytest.raises(ServiceUnavailable):
        await lc.route(body("lc-unroutable"))
    assert phase(lc) is Phase.RECEIVING and not lc.scheduled
    before = errors("lc-unroutable", "ServiceUnavailable")
    lc.close(ServiceUnavailable("no endpoints"))
    assert errors("lc-unroutable", "ServiceUnavailable") == before + 1
    assert running("lc-unroutable") == 0


async def test_a_request_is_routed_once() -> None:
    """Routing is the only way out of RECEIVING, and happens once."""
    lc = await routed("lc-twice")
    with pytest.raises(RuntimeError, match="route in phase ROUTED"):
        await lc.route(body("lc-twice"))
    with pytest.raises(RuntimeError, match="route in phase ROUTED"):
        lc.route_headers_only()
    lc.close()


def rewritten(d_hold: bool) -> tuple[RequestLifecycle, Hooks]:
    hooks = Hooks()
    d, _ = director(hooks=hooks)
    return d.start({"x-gateway-model-name-rewrite": "served"}, {}, can_hold_response=d_hold), hooks


async def test_non_streamed_rewritten_response_is_held_to_its_end() -> None:
    """The client's model name is restored even when it straddles chunks: the body is held whole."""
    lc, hooks = rewritten(True)
    await lc.route(body("client"))
    lc.response_headers(dict(JSON), end_of_stream=False)
    assert lc.response_chunk(b'{"model":"ser', False) is None
    assert lc.response_chunk(b'ved","x":1}', False) is None
    assert phase(lc) is Phase.RESPONDING
    assert lc.response_chunk(b"", True) == b'{"model":"client","x":1}'
    assert phase(lc) is Phase.COMPLETE and len(hooks.completions) == 1
    lc.close()


async def test_held_response_is_flushed_by_trailers() -> None:
    """Trailers end a held body without an end-of-stream chunk: the whole body comes out then."""
    lc, hooks = rewritten(True)
    await lc.route(body("client"))
    lc.response_headers(dict(JSON), end_of_stream=False)
    assert lc.response_chunk(b'{"model":"served"}', False) is None
    assert lc.response_end() == b'{"model":"client"}'
    assert phase(lc) is Phase.COMPLETE and len(hooks.completions) == 1
    assert lc.response_end() is None  # already complete
    lc.close()


@pytest.mark.parametrize(
    ("can_hold", "headers"),
    [
        pytest.param(True, SSE, id="streamed-response"),
        pytest.param(False, JSON, id="edge-cannot-hold"),
    ],
)
async def test_rewritten_response_is_not_held(can_hold: bool, headers: dict[str, str]) -> None:
    """SSE events carry the model whole, and an edge that must answer every chunk cannot hold."""
    lc, _ = rewritten(can_hold)
    await lc.route(body("client"))
    lc.response_headers(dict(headers), end_of_stream=False)
    assert lc.response_chunk(b'{"model":"served"}', False) == b'{"model":"client"}'
    unchanged = b"no model here"
    assert lc.response_chunk(unchanged, False) is unchanged
    assert lc.response_end() is None
    assert phase(lc) is Phase.COMPLETE
    lc.close()


def _exported(name: str, model: str) -> bool:
    from epp.metrics.series import REGISTRY

    return any(
        s.name == name and s.labels.get("model_name") == model for f in REGISTRY.collect() for s in f.samples
    )


async def test_response_metrics_are_observed_per_request_into_each_models_series() -> None:
    """The per-model children are bound once and reused: every request is one observation of its
    own model's series, and a series no request observed is not exported (the usage parser
    reports prompt and completion tokens, never cached ones)."""
    duration = "inference_objective_request_duration_seconds_count"
    for i in range(3):
        for model in ("lc-bound-a", "lc-bound-b"):
            lc = await routed(model)
            assert running(model) == 1
            lc.response_headers(dict(SSE), end_of_stream=False)
            lc.response_chunk(b"data: [DONE]\n\n", True)
            lc.close()
            assert running(model) == 0
            assert metric(duration, model_name=model, target_model_name=model) == i + 1
            assert (
                metric(
                    "inference_objective_request_ttft_seconds_count",
                    model_name=model,
                    target_model_name=model,
                )
                == i + 1
            )
            tokens = "inference_objective_input_tokens_count"
            assert metric(tokens, model_name=model, target_model_name=model) == i + 1
    assert not _exported("inference_objective_prompt_cached_tokens_count", "lc-bound-a")  # never reported


class _ReadOnlyHooks(Hooks):
    """A response-header hook that reads the headers and changes nothing, or sets one to its own value."""

    def response_header(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        resp.headers["content-type"] = resp.headers.get("content-type", "")


async def test_headers_a_hook_leaves_as_they_were_are_not_reported_as_added() -> None:
    """Hooked headers are compared with a copy: unchanged (a value set to itself) reports nothing."""
    lc = await routed("lc-readonly", _ReadOnlyHooks())
    assert lc.response_headers(dict(SSE), end_of_stream=False) == []
    lc.close()


class EveryChunk:
    """A response body hook that records each call: (its name, the chunk, end of stream)."""

    TYPE: ClassVar[str] = "every-chunk"

    def __init__(self, name: str, calls: list[tuple[str, bytes, bool]]) -> None:
        self.typed_name = TypedName(self.TYPE, name)
        self.calls = calls

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        resp: ResponseInfo,
        chunk: bytes,
        t: Endpoint | None,
    ) -> None:
        self.calls.append((self.typed_name.name, chunk, resp.end_of_stream))


class FirstByte(EveryChunk):
    """The same, declaring that it acts on the first body byte only."""

    TYPE: ClassVar[str] = "first-byte"
    FIRST_BYTE_ONLY: ClassVar[bool] = True


async def body_hooks(
    calls: list[tuple[str, bytes, bool]],
) -> RequestLifecycle:
    """A routed request whose pipeline has a first-byte hook between two every-chunk hooks."""
    d, ds = director()
    pipe = dataclasses.replace(
        d._pipeline,
        response_body=(EveryChunk("a", calls), FirstByte("first", calls), EveryChunk("b", calls)),  # type: ignore[arg-type]
    )
    d._pipeline = pipe
    d.responses = ResponseSide(ds, pipe)
    lc = d.start({}, {})
    await lc.route(body("lc-first-byte"))
    lc.response_headers(dict(SSE), end_of_stream=False)
    return lc


async def test_a_first_byte_hook_sees_chunks_up_to_the_first_byte_in_its_place() -> None:
    """FIRST_BYTE_ONLY: called for empty chunks and the first non-empty one, in its configured
    place, then no more; the others see every chunk."""
    calls: list[tuple[str, bytes, bool]] = []
    lc = await body_hooks(calls)
    for chunk, eos in ((b"", False), (b"x", False), (b"y", False), (b"z", True)):
        lc.response_chunk(chunk, eos)
    assert calls == [
        ("a", b"", False),
        ("first", b"", False),
        ("b", b"", False),
        ("a", b"x", False),
        ("first", b"x", False),
        ("b", b"x", False),
        ("a", b"y", False),
        ("b", b"y", False),
        ("a", b"z", True),
        ("b", b"z", True),
    ]
    lc.close()


async def test_a_first_byte_hook_sees_the_end_of_a_bodiless_response() -> None:
    calls: list[tuple[str, bytes, bool]] = []
    lc = await body_hooks(calls)
    lc.response_chunk(b"", True)
    assert calls == [("a", b"", True), ("first", b"", True), ("b", b"", True)]
    lc.close()


def test_the_first_byte_plugins_declare_it() -> None:
    """The two built-in hooks that only release work at the first byte skip the chunks after it."""
    from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
    from epp.scheduling.scorers.prefill_load import PrefillLoadScorer

    assert PrefillLoadScorer.FIRST_BYTE_ONLY and PrecisePrefixCacheScorer.FIRST_BYTE_ONLY
