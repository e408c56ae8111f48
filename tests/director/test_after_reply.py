"""Work that only records runs after the reply it follows is written (director.after_reply).

The queue itself (order, failures, when it runs), then the director and the lifecycle: which
steps wait for the reply, that the next request routes only after them, and that a hook that
may shape a reply keeps running before it, after whatever was deferred.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from typing import ClassVar

import pytest
from structlog.testing import capture_logs

from epp.datalayer.api import Endpoint
from epp.director.after_reply import AfterReply, after_reply_only
from epp.director.director import Director
from epp.director.lifecycle import RequestLifecycle
from epp.plugin.base import TypedName
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult
from tests.director.test_director import Hooks, body, director

SSE = {":status": "200", "content-type": "text/event-stream"}


# -- the queue --------------------------------------------------------------------------------
class Item:
    """A queued item that notes its name when it runs (a request's lifecycle, in the EPP)."""

    def __init__(self, seen: list[str], name: str, then: Callable[[], None] | None = None) -> None:
        self.seen = seen
        self.name = name
        self.then = then

    def run_later(self) -> None:
        self.seen.append(self.name)
        if self.then is not None:
            self.then()


def test_disabled_it_runs_the_work_at_once() -> None:
    after = AfterReply()
    seen: list[str] = []
    after.defer(Item(seen, "a"))
    assert seen == ["a"]
    assert not after.queue


def test_queued_during_a_read_it_runs_when_the_read_is_written_in_order() -> None:
    after = AfterReply(enabled=True)
    after.reading = True
    seen: list[str] = []
    for name in "abc":
        after.defer(Item(seen, name))
    assert seen == []  # the read's replies are not written yet
    after.finished_reading()
    assert seen == ["a", "b", "c"]
    assert not after.reading


def yields(monkeypatch: pytest.MonkeyPatch, seen: list[str]) -> None:
    """Note ``sched_yield`` calls in ``seen``, between the work they came before or after."""
    monkeypatch.setattr(os, "sched_yield", lambda: seen.append("yield"))


def test_replies_that_end_a_response_after_an_idle_wait_give_up_the_cpu_once_before_the_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    after = AfterReply(enabled=True)
    seen: list[str] = []
    yields(monkeypatch, seen)
    after.reading = True
    after.defer(Item(seen, "a"))
    after.hand_over = True
    after.defer(Item(seen, "b"))
    after.finished_reading(idle=True)
    assert seen == ["yield", "a", "b"]
    after.reading = True
    after.defer(Item(seen, "c"))  # the next read's work: no response ended
    after.finished_reading(idle=True)
    assert seen == ["yield", "a", "b", "c"]


def test_no_yield_when_busy_without_work_or_once_the_work_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    after = AfterReply(enabled=True)
    seen: list[str] = []
    yields(monkeypatch, seen)
    after.reading = True
    after.hand_over = True
    after.defer(Item(seen, "a"))
    after.finished_reading(idle=False)  # reads back to back: Envoy is always runnable, no switch
    after.reading = True
    after.hand_over = True
    after.finished_reading(idle=True)  # nothing queued: nothing to go after the replies
    after.reading = True
    after.hand_over = True
    after.defer(Item(seen, "b"))
    after.run()  # someone needed it first (routing the next request): it ran, the chance is gone
    after.defer(Item(seen, "c"))
    after.finished_reading(idle=True)
    assert seen == ["a", "b", "c"]


async def test_queued_outside_a_read_it_runs_on_the_next_loop_iteration() -> None:
    """A routing task or a task-owned call defers outside any read: a loop callback runs it."""
    after = AfterReply(enabled=True)
    seen: list[str] = []
    after.defer(Item(seen, "a"))
    after.defer(Item(seen, "b"))  # one callback for both
    assert seen == []
    await asyncio.sleep(0)  # one loop iteration: the callback armed by the first defer
    assert seen == ["a", "b"]


def test_queued_without_a_loop_it_runs_at_once() -> None:
    after = AfterReply(enabled=True)
    seen: list[str] = []
    after.defer(Item(seen, "a"))
    assert seen == ["a"]


def test_a_failing_item_is_logged_and_the_rest_runs() -> None:
    after = AfterReply(enabled=True)
    after.reading = True
    seen: list[str] = []

    def fail() -> None:
        raise ValueError("boom")

    after.defer(Item(seen, "a", fail))
    after.defer(Item(seen, "b"))
    with capture_logs() as logs:
        after.finished_reading()
    assert seen == ["a", "b"]
    assert [e["event"] for e in logs] == ["after_reply_failed"]
    assert logs[0]["work"] == "Item"


def test_an_item_that_runs_the_queue_keeps_the_order() -> None:
    """A deferred completion may let a held request route, which runs the queue first."""
    after = AfterReply(enabled=True)
    after.reading = True
    seen: list[str] = []

    def nested() -> None:
        after.defer(Item(seen, "c"))  # queued after b
        after.run()  # goes on from b, then c

    after.defer(Item(seen, "a", nested))
    after.defer(Item(seen, "b"))
    after.finished_reading()
    assert seen == ["a", "b", "c"]


def test_only_plugins_that_all_declare_it_are_deferred() -> None:
    assert after_reply_only([])
    assert after_reply_only([Recorder([])])
    assert not after_reply_only([Recorder([]), Shaping([])])


# -- the director and the lifecycle ----------------------------------------------------------
class Recorder:
    """Hooks of every response kind and pre-request that only record: ``AFTER_REPLY``."""

    TYPE: ClassVar[str] = "recorder"
    AFTER_REPLY: ClassVar[bool] = True

    def __init__(self, calls: list[str], name: str = "rec", *, failing_body: bool = False) -> None:
        self.typed_name = TypedName(self.TYPE, name)
        self.calls = calls
        self.failing_body = failing_body  # its body hook raises (a bug in a plugin)

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.calls.append(f"{self.typed_name.name}:pre_request")

    def response_header(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        self.calls.append(f"{self.typed_name.name}:header")

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        resp: ResponseInfo,
        chunk: bytes,
        t: Endpoint | None,
    ) -> None:
        if self.failing_body:
            raise RuntimeError("body hook bug")
        self.calls.append(
            f"{self.typed_name.name}:body {chunk.decode()}{' eos' if resp.end_of_stream else ''}"
        )

    def response_complete(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        self.calls.append(f"{self.typed_name.name}:complete")


class Shaping(Recorder):
    """The same hooks, not declaring that they leave the reply alone (the header hook adds one)."""

    TYPE: ClassVar[str] = "shaping"
    AFTER_REPLY: ClassVar[bool] = False

    def response_header(
        self, state: CycleState, request: InferenceRequest, resp: ResponseInfo, t: Endpoint | None
    ) -> None:
        super().response_header(state, request, resp, t)
        resp.headers["x-shaped"] = "yes"


def deferring(
    pre: tuple[object, ...] = (),
    header: tuple[object, ...] = (),
    body_hooks: tuple[object, ...] = (),
    complete: tuple[object, ...] = (),
) -> Director:
    """A director with these hooks whose after-reply queue is on (as the h2 edge turns it on)."""
    d, ds = director()
    pipe = dataclasses.replace(
        d.pipeline,
        pre_request=pre,  # type: ignore[arg-type]
        response_header=header,  # type: ignore[arg-type]
        response_body=body_hooks,  # type: ignore[arg-type]
        response_complete=complete,  # type: ignore[arg-type]
    )
    out = Director(ds, pipe, after_reply=AfterReply(enabled=True))
    return out


async def routed_in_a_read(d: Director, model: str) -> RequestLifecycle:
    after = d.after_reply
    after.reading = True
    lc = d.start({}, {}, can_hold_response=True)
    await lc.route(body(model))
    return lc


async def test_recording_steps_wait_for_the_reply_and_run_in_order() -> None:
    calls: list[str] = []
    rec = Recorder(calls)
    d = deferring((rec,), (rec,), (rec,), (rec,))
    after = d.after_reply
    lc = await routed_in_a_read(d, "ar-order")
    assert calls == []  # the routing reply is being written: nothing recorded yet
    after.finished_reading()
    assert calls == ["rec:pre_request"]

    after.reading = True
    assert lc.response_headers(dict(SSE), end_of_stream=False) == []
    assert calls == ["rec:pre_request"]
    after.finished_reading()
    assert calls == ["rec:pre_request", "rec:header"]

    after.reading = True
    x = b"x"
    assert lc.response_chunk(x, False) is x  # a chunk in mid-response: accounted at once
    assert calls == ["rec:pre_request", "rec:header", "rec:body x"]
    assert lc.response_chunk(b"y", True) == b"y"
    assert lc.response_metadata is None
    assert calls == ["rec:pre_request", "rec:header", "rec:body x"]  # the last one waits
    after.finished_reading()
    assert calls == ["rec:pre_request", "rec:header", "rec:body x", "rec:body y eos", "rec:complete"]
    assert lc.ctx.response is not None and lc.ctx.response.body_bytes == 2
    lc.close()
    assert calls.count("rec:complete") == 1


async def test_only_the_reply_that_ends_the_response_hands_the_cpu_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The routing reply's work and a mid-response chunk's run at once; the last chunk's after a yield."""
    calls: list[str] = []
    yields(monkeypatch, calls)
    rec = Recorder(calls)
    d = deferring((rec,), (rec,), (rec,), (rec,))
    after = d.after_reply
    lc = await routed_in_a_read(d, "ar-hand-over")
    after.finished_reading(idle=True)
    after.reading = True
    lc.response_headers(dict(SSE), end_of_stream=False)
    after.finished_reading(idle=True)
    after.reading = True
    lc.response_chunk(b"x", False)
    after.finished_reading(idle=True)
    assert calls == ["rec:pre_request", "rec:header", "rec:body x"]
    after.reading = True
    lc.response_chunk(b"y", True)
    after.finished_reading(idle=True)
    assert calls == ["rec:pre_request", "rec:header", "rec:body x", "yield", "rec:body y eos", "rec:complete"]
    lc.close()


async def test_a_chunk_read_with_its_headers_waits_with_them() -> None:
    """A non-streamed body read with its headers: the chunk and the end wait for the replies too."""
    calls: list[str] = []
    rec = Recorder(calls)
    d = deferring((rec,), (rec,), (rec,), (rec,))
    lc = await routed_in_a_read(d, "ar-one-read")
    d.after_reply.finished_reading()
    d.after_reply.reading = True
    lc.response_headers(dict(SSE), end_of_stream=False)
    x = b"x"
    assert lc.response_chunk(x, False) is x
    assert lc.response_chunk(b"", True) == b""
    assert calls == ["rec:pre_request"]
    d.after_reply.finished_reading()
    assert calls == ["rec:pre_request", "rec:header", "rec:body x", "rec:body  eos", "rec:complete"]
    lc.close()


async def test_a_hook_that_may_shape_the_reply_runs_before_it_after_what_was_deferred() -> None:
    calls: list[str] = []
    d = deferring(pre=(Recorder(calls),), header=(Shaping(calls, "shape"),))
    lc = await routed_in_a_read(d, "ar-shape")
    assert calls == []
    added = lc.response_headers(dict(SSE), end_of_stream=False)  # the same read, before it is written
    assert calls == ["rec:pre_request", "shape:header"]  # the deferred step ran first
    assert added == [("x-shaped", "yes")]
    d.after_reply.finished_reading()
    lc.close()


async def test_a_completion_that_writes_metadata_runs_before_the_last_reply() -> None:
    hooks = Hooks()  # its completion writes dynamic metadata; it declares nothing
    d = deferring(complete=(hooks,))
    lc = await routed_in_a_read(d, "ar-metadata")
    lc.response_headers(dict(SSE), end_of_stream=False)
    lc.response_chunk(b"x", True)
    assert lc.response_metadata == {"envoy.lb": {"x-gateway-inference-request-cost": 10}}
    assert len(hooks.completions) == 1
    d.after_reply.finished_reading()
    lc.close()


async def test_the_next_request_routes_after_the_previous_ones_deferred_work() -> None:
    """Two requests in one read: the second is scheduled only once the first's hooks counted it."""
    calls: list[str] = []
    d = deferring(pre=(Recorder(calls),))
    first = await routed_in_a_read(d, "ar-next")
    assert calls == []

    class Producer:
        typed_name = TypedName("seen", "seen")

        async def prepare_request_data(
            self, state: CycleState, request: InferenceRequest, eps: object
        ) -> None:
            calls.append("second:produce")

    second_pipe = dataclasses.replace(d.pipeline, producers=(Producer(),))  # type: ignore[arg-type]
    second_director = d.swap(second_pipe)
    second = await routed_in_a_read(second_director, "ar-next")
    assert calls[:2] == ["rec:pre_request", "second:produce"]
    d.after_reply.finished_reading()
    first.close()
    second.close()


async def test_a_deferred_completion_runs_even_when_the_last_chunk_fails() -> None:
    calls: list[str] = []

    rec = Recorder(calls)
    d = deferring(body_hooks=(Recorder(calls, "bad", failing_body=True),), complete=(rec,))
    lc = await routed_in_a_read(d, "ar-fail")
    lc.response_headers(dict(SSE), end_of_stream=False)
    lc.response_chunk(b"x", True)
    with capture_logs() as logs:
        d.after_reply.finished_reading()
    assert calls == ["rec:complete"]
    assert [e["event"] for e in logs] == ["after_reply_failed"]
    lc.close()
    assert calls == ["rec:complete"]  # once


async def test_closing_runs_what_the_request_left_first() -> None:
    """A stream that ends before its read is written still settles every step once, in order."""
    calls: list[str] = []
    rec = Recorder(calls)
    d = deferring((rec,), (rec,), (rec,), (rec,))
    lc = await routed_in_a_read(d, "ar-close")
    lc.response_headers(dict(SSE), end_of_stream=False)
    lc.close()
    assert calls == ["rec:pre_request", "rec:header", "rec:complete"]
    d.after_reply.finished_reading()
    assert calls == ["rec:pre_request", "rec:header", "rec:complete"]


async def test_a_director_made_by_swap_shares_the_queue() -> None:
    d = deferring()
    assert d.swap(d.pipeline).after_reply is d.after_reply


def test_the_built_in_recording_hooks_declare_it() -> None:
    """The in-flight, prefill-load and approximate-prefix hooks only count: they may follow the reply."""
    from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
    from epp.director.producers.inflight_load import InFlightLoadProducer
    from epp.scheduling.scorers.prefill_load import PrefillLoadScorer

    for cls in (ApproxPrefixCacheProducer, InFlightLoadProducer, PrefillLoadScorer):
        assert cls.AFTER_REPLY is True


async def test_unless_the_edge_turns_it_on_every_step_runs_inline() -> None:
    """The grpc.aio transport and directors driven directly: each hook runs where it always did."""
    calls: list[str] = []
    rec = Recorder(calls)
    d, ds = director()
    pipe = dataclasses.replace(
        d.pipeline,
        pre_request=(rec,),  # type: ignore[arg-type]
        response_header=(rec,),  # type: ignore[arg-type]
        response_body=(rec,),  # type: ignore[arg-type]
        response_complete=(rec,),  # type: ignore[arg-type]
    )
    d = Director(ds, pipe)
    assert not d.after_reply.enabled
    lc = d.start({}, {})
    await lc.route(body("ar-inline"))
    assert calls == ["rec:pre_request"]
    lc.response_headers(dict(SSE), end_of_stream=False)
    lc.response_chunk(b"x", True)
    assert calls == ["rec:pre_request", "rec:header", "rec:body x eos", "rec:complete"]
    lc.close()
