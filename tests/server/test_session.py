"""The shape a transport drives: ``handle`` answers at once, ``route`` only for a completed body."""

from __future__ import annotations

import gc

from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.director.lifecycle import Phase, RequestLifecycle
from epp.server import responses as r
from epp.server import wire
from epp.server.session import ExtProcSession
from tests.server.harness import (
    Harness,
    as_received,
    pods,
    req_body,
    req_headers,
    resp_body,
    resp_headers,
    resp_trailers,
    streamed,
)

BODY = b'{"model":"my-model","prompt":"hi","max_tokens":3}'


def session() -> tuple[ExtProcSession, list[str]]:
    h = Harness()
    h.set_pods(pods((0, 0, 0.1), (1, 3, 0.2)))
    closed: list[str] = []
    return ExtProcSession(h.director, on_close=lambda: closed.append("closed")), closed


# Read through calls: mypy would keep an asserted attribute narrowed across handle().
def pending(s: ExtProcSession) -> bool:
    return s.route_pending


def phase(s: ExtProcSession) -> Phase | None:
    return None if s.lifecycle is None else s.lifecycle.phase


def released(s: ExtProcSession, lc: RequestLifecycle) -> bool:
    """The session keeps nothing of its request, and the request nothing of the session."""
    return s.lifecycle is None and s.writer is None and lc.request.edge is None


def parse(replies: list[r.Reply]) -> list[pb.ProcessingResponse]:
    return [pb.ProcessingResponse.FromString(r.serialize(x)) for x in replies]


async def test_only_the_body_completing_message_needs_routing() -> None:
    """Headers and partial bodies answer nothing yet; end of body leaves route() to answer."""
    s, closed = session()
    assert s.handle(as_received(req_headers({":path": "/v1/completions"}))) == []
    assert s.handle(as_received(req_body(BODY[:10], eos=False))) == []
    assert not pending(s)
    assert s.handle(as_received(req_body(BODY[10:], eos=True))) == []
    assert pending(s)
    replies = parse(await s.route())
    assert not pending(s) and not s.finished
    assert [m.WhichOneof("response") for m in replies] == ["request_headers", "request_body"]
    assert streamed(replies[1]) == (BODY, True)
    assert s.lifecycle is not None and phase(s) is Phase.ROUTED

    # the response side never waits: every chunk is answered by handle itself
    assert (
        len(s.handle(as_received(resp_headers({":status": "200", "content-type": "text/event-stream"})))) == 1
    )
    for eos in (False, True):
        (reply,) = parse(s.handle(as_received(resp_body(b"data: {}\n\n", eos=eos))))
        assert not pending(s)
        assert streamed(reply) == (b"data: {}\n\n", eos)
    assert phase(s) is Phase.COMPLETE
    lc = s.lifecycle
    assert not released(s, lc)
    s.close()
    s.close()
    assert closed == ["closed"] and lc.phase is Phase.CLOSED
    # closed: the session lets go of the request (no reference cycle left for the cyclic GC)
    assert released(s, lc)


async def test_a_chunk_reply_is_body_replys_bytes_whether_its_length_was_seen_or_not() -> None:
    """The per-chunk path reads ``wire.BODY_HEADS`` itself: the same bytes as ``wire.body_reply``
    (held to upb's by test_wire), for a length seen before and one that was not."""
    s, _ = session()
    s.handle(as_received(req_headers({":path": "/v1/completions"})))
    s.handle(as_received(req_body(BODY, eos=True)))
    await s.route()
    s.handle(as_received(resp_headers({":status": "200", "content-type": "text/event-stream"})))
    wire.BODY_HEADS[False][False].clear()
    wire.BODY_HEADS[False][True].clear()
    for chunk, eos in (
        (b"data: 1\n\n", False),
        (b"data: 2\n\n", False),
        (b"x" * 300, False),
        (b"x" * 300, True),
    ):
        assert s.handle(as_received(resp_body(chunk, eos=eos))) == [wire.body_reply(chunk, eos, False)]
    s.close()


async def test_request_trailers_end_the_body() -> None:
    """A body ended by trailers: route() answers with the routing replies, then the trailers reply."""
    s, _ = session()
    s.handle(as_received(req_headers({":path": "/v1/completions"})))
    s.handle(as_received(req_body(BODY, eos=False)))
    assert s.handle(as_received(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))) == []
    assert pending(s)
    replies = parse(await s.route())
    assert [m.WhichOneof("response") for m in replies] == [
        "request_headers",
        "request_body",
        "request_trailers",
    ]
    assert streamed(replies[1]) == (BODY, False)
    # a response ending in trailers completes the request
    s.handle(as_received(resp_headers({":status": "200"})))
    assert parse(s.handle(as_received(resp_trailers())))[-1].WhichOneof("response") == "response_trailers"
    assert s.lifecycle is not None and phase(s) is Phase.COMPLETE
    s.close()


async def test_routing_error_is_an_immediate_response() -> None:
    """A body the director refuses ends the session with GIE's error; closing records it."""
    s, closed = session()
    s.handle(as_received(req_headers({":path": "/v1/completions"})))
    s.handle(as_received(req_body(b"{", eos=True)))
    (reply,) = parse(await s.route())
    assert reply.immediate_response.status.code == 400
    assert s.finished and not pending(s)
    assert s.error is not None and s.error.code == "BadRequest"
    lc = s.lifecycle
    s.close()
    assert closed == ["closed"]
    assert lc is not None and lc.phase is Phase.CLOSED


def test_headers_only_request_is_answered_at_once() -> None:
    """A GET is routed from its headers inside handle: no routing task."""
    s, _ = session()
    (reply,) = parse(s.handle(as_received(req_headers({":path": "/v1/models", ":method": "GET"}, eos=True))))
    assert not pending(s)
    assert reply.WhichOneof("response") == "request_headers"
    assert s.lifecycle is not None and phase(s) is Phase.ROUTED and not s.lifecycle.scheduled
    s.close()


async def test_an_evicted_request_ends_at_its_next_response_message_with_upstreams_429() -> None:
    """FULL_DUPLEX_STREAMED response: the session is the request's edge; once flow control evicts
    it, the next response message is answered with llm-d-router's ImmediateResponse and the
    session ends; closing runs what flow control registered."""
    s, closed = session()
    s.handle(as_received(req_headers({":path": "/v1/completions"})))
    assert s.lifecycle is not None and s.lifecycle.request.edge is s
    s.handle(as_received(req_body(BODY, eos=True)))
    await s.route()
    ended: list[str] = []
    s.lifecycle.request.on_closed = lambda: ended.append("untracked")
    (headers_reply,) = parse(
        s.handle(as_received(resp_headers({":status": "200", "content-type": "text/event-stream"})))
    )
    assert headers_reply.WhichOneof("response") == "response_headers"
    s.handle(as_received(resp_body(b"data: {}\n\n", eos=False)))
    s.evict()
    (reply,) = parse(s.handle(as_received(resp_body(b"data: {}\n\n", eos=False))))
    ir = reply.immediate_response
    assert (ir.status.code, ir.body) == (429, b"request evicted by flow control")
    assert [(h.header.key, h.header.raw_value) for h in ir.headers.set_headers] == [
        ("x-llm-d-request-dropped-reason", b"evicted")
    ]
    assert s.finished and s.error is not None and s.error.reason == "evicted"
    s.close()
    assert ended == ["untracked"] and closed == ["closed"]


def test_a_request_whose_response_envoy_does_not_stream_has_no_edge() -> None:
    s, _ = session()
    msg = req_headers({":path": "/v1/completions"})
    msg.protocol_config.request_body_mode = mode_pb.ProcessingMode.BUFFERED
    msg.protocol_config.response_body_mode = mode_pb.ProcessingMode.BUFFERED
    s.handle(as_received(msg))
    assert s.lifecycle is not None and s.lifecycle.request.edge is None


async def test_a_closed_request_leaves_nothing_for_the_cyclic_collector() -> None:
    """Once closed, reference counting frees the request's objects: none of them sits in a cycle
    (the gen-0 passes that would otherwise scan ~25 objects a request cost the hot path)."""
    s, _ = session()

    class Writer:  # the transport's driver points at the session and the session at it
        def __init__(self, session: ExtProcSession) -> None:
            self.session = session
            session.writer = self

        def write_unasked(self) -> None:
            pass

    Writer(s)
    s.handle(as_received(req_headers({":path": "/v1/completions", "content-type": "application/json"})))
    s.handle(as_received(req_body(BODY, eos=True)))
    await s.route()
    s.handle(as_received(resp_headers({":status": "200", "content-type": "text/event-stream"})))
    s.handle(as_received(resp_body(b"data: {}\n\n", eos=True)))
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        s.close()
        del s
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not kinds & {"RequestLifecycle", "RequestContext", "InferenceRequest", "CycleState"}, kinds
