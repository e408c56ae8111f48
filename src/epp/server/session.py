"""One ext_proc session (one ``Process`` call, one HTTP request): messages and body modes in,
lifecycle calls out.

The request's state lives in the director's ``RequestLifecycle`` (one per request, one
``Phase``); this module only translates.  Body modes come from ``protocol_config`` on the
first message:

* FULL_DUPLEX_STREAMED (GIE's mode): request headers are held until the body ends; then
  the routing headers reply and the body as <= 62,000-byte streamed mutations.
* BUFFERED: the headers are answered at once (Envoy then sends the whole
  body); the body reply carries the routing header mutation.  This mode fails open.
* STREAMED / BUFFERED_PARTIAL / NONE: Envoy applies routing headers only before the body
  (or only in BUFFERED mode), so the request is routed from its headers alone, like a GET,
  and any body is passed through untouched.

A transport drives an ``ExtProcSession`` with two calls.  ``handle(msg)`` is synchronous and answers
every message that needs no I/O, so a transport that writes from its read callback (the h2
transport) answers response chunks without a task switch (docs/decisions.md, "ext_proc
transport").  Only the message that completes a request body (or the request trailers that
end one) needs routing, which may wait (admission, data producers): ``handle`` then returns
no replies and sets ``route_pending``, and the transport awaits ``route()`` for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final, Protocol

import structlog

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.type.v3 import http_status_pb2
from epp.director.context import RoutingDecision
from epp.director.director import Director
from epp.director.lifecycle import ROUTED, Phase, RequestLifecycle
from epp.errors import BadRequest, EppError, Internal, PayloadTooLarge, ResourceExhausted
from epp.server import responses, wire
from epp.server.incoming import (
    KIND_NAMES,
    REQUEST_BODY,
    REQUEST_HEADERS,
    REQUEST_TRAILERS,
    RESPONSE_BODY,
    RESPONSE_HEADERS,
    RESPONSE_TRAILERS,
    Incoming,
    ProtocolConfig,
)
from epp.tracing.otel import RequestTrace, Tracing

log = structlog.get_logger(__name__)
_NO_TRACING = Tracing()
_EMPTY_REQUEST_HEADERS_BYTES: Final = responses.EMPTY_REQUEST_HEADERS.SerializeToString()
# llm-d-router's answer to an evicted request (handlers/server.go): 429, this body, and why.
EVICTED_BODY: Final = b"request evicted by flow control"
EVICTED_REASON: Final = "evicted"
_EVICTED_REPLY: Final = pb.ProcessingResponse(
    immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=http_status_pb2.TooManyRequests),
        body=EVICTED_BODY,
        headers=pb.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(
                        key=responses.DROPPED_REASON_HEADER, raw_value=EVICTED_REASON.encode()
                    )
                )
            ]
        ),
    )
).SerializeToString()

# A response chunk's reply bytes before the chunk, by end_of_stream then length (kept by ``wire``).
_RESPONSE_HEADS: Final = wire.BODY_HEADS[False]

FULL_DUPLEX: Final = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED: Final = mode_pb.ProcessingMode.BUFFERED
BUFFERED_PARTIAL: Final = mode_pb.ProcessingMode.BUFFERED_PARTIAL
STREAMED: Final = mode_pb.ProcessingMode.STREAMED
NONE: Final = mode_pb.ProcessingMode.NONE


def overridable(config: ProtocolConfig) -> bool:
    """Whether Envoy (1.40) honours a ``mode_override`` on a stream with this ``protocol_config``.

    Envoy ignores the field whenever either configured body mode is FULL_DUPLEX_STREAMED (GIE's
    config) or ``send_body_without_waiting_for_header_response`` is set; otherwise it applies it
    if ``allow_mode_override`` is on and ``allowed_override_modes`` is empty or lists it (which
    the EPP cannot see: deploy/envoy/lean.yaml lists exactly ``lean_override``'s modes).
    docs/envoy.md, "When Envoy honours mode_override".
    """
    return (
        config.request_body_mode != FULL_DUPLEX
        and config.response_body_mode != FULL_DUPLEX
        and not config.send_body_without_waiting_for_header_response
    )


@functools.cache
def lean_override(request_mode: int, *, headers: bool) -> bytes:
    """The ``mode_override`` field (ProcessingResponse field 9) that skips the response body and
    trailers, and the response headers unless ``headers``; the request side as configured.

    Request trailers stay SEND: with a BUFFERED body, HTTP/2 trailers are what ends the body, so
    skipping them would leave the request unrouted.  Body modes are always taken from the
    override, so the request body mode is restated.  Cached: at most a few distinct values,
    and one bytes object per request saved.
    """
    send, skip = mode_pb.ProcessingMode.SEND, mode_pb.ProcessingMode.SKIP
    mode = mode_pb.ProcessingMode(
        request_header_mode=send,
        request_body_mode=request_mode,  # type: ignore[arg-type]
        request_trailer_mode=send,
        response_header_mode=send if headers else skip,
        response_body_mode=NONE,
        response_trailer_mode=skip,
    )
    return wire.field(b"\x4a", mode.SerializeToString())


class UnaskedWriter(Protocol):
    """A transport able to write a session's reply that no message asked for."""

    def write_unasked(self) -> None: ...


class ExtProcSession:
    """One ext_proc session, message by message.

    Request-phase errors become an ImmediateResponse (GIE's status and body) and set
    ``finished``: the call then ends OK.  An unexpected exception is logged with its
    traceback and answered as a 500, so one bad request never takes the transport
    down with it.  ``close`` must run exactly once whatever happens (it is idempotent).
    """

    __slots__ = (
        "_body",
        "_body_size",
        "_config",
        "_director",
        "_ended_by_trailers",
        "_evicted",
        "_max_body",
        "_on_close",
        "_tracing",
        "closed",
        "error",
        "finished",
        "lifecycle",
        "request_mode",
        "response_mode",
        "route_pending",
        "trace",
        "writer",
    )

    def __init__(
        self,
        director: Director,
        max_body_bytes: int = 0,
        tracing: Tracing | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """Positional from the servicer: a class called with keywords packs them into a dict for
        ``__init__`` (~2k instructions a request)."""
        self._director = director
        self._max_body = max_body_bytes
        self._tracing = tracing or _NO_TRACING
        self._on_close = on_close
        self.trace: RequestTrace | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._ended_by_trailers = False
        self.lifecycle: RequestLifecycle | None = None  # None: no request headers (a response-only session)
        self.error: EppError | None = None
        self.finished = False
        self.closed = False
        self.route_pending = False  # the request body is complete: ``route()`` answers it
        self._evicted = False  # flow control evicted the request: its next response message ends it
        # The transport's way to write a reply unasked (h2: at once, when no task owns the call);
        # None: the next message Envoy sends carries it.
        self.writer: UnaskedWriter | None = None
        self.request_mode: int = FULL_DUPLEX
        self.response_mode: int = FULL_DUPLEX
        self._config: ProtocolConfig | None = (
            None  # the stream's protocol_config (``_skip_response_override``)
        )

    # the transport's two calls ----------------------------------------------------
    def handle(self, msg: Incoming) -> list[responses.Reply]:
        """The replies to one message, at once.  Sets ``route_pending`` (and returns []) when the
        message completed the request body: the replies then come from ``await route()``."""
        kind = msg.kind
        try:
            if kind == RESPONSE_BODY:  # once per streamed token: inlined, and first
                if self._evicted:
                    return self._end_evicted()
                chunk, eos = msg.body, msg.end_of_stream
                lc = self.lifecycle
                if lc is None:
                    return _echo(chunk, eos, self.response_mode, request=False)
                out = lc.response_chunk(chunk, eos)
                if out is None:  # held by the lifecycle (FULL_DUPLEX_STREAMED only)
                    return []
                metadata = lc.response_metadata if eos else None
                if self.response_mode == FULL_DUPLEX:
                    n = len(out)
                    if metadata is None and n <= responses.BODY_CHUNK_LIMIT:  # the usual chunk: one mutation
                        head = _RESPONSE_HEADS[eos].get(n)  # ``wire.body_reply`` inlined: a call less
                        if head is not None:
                            return [b"".join((head, out, wire.EOS)) if eos else head + out]
                        return [wire.body_reply(out, eos, False)]
                    return responses.streamed_response_body(out, eos, metadata)
                return [responses.replaced_response_body(out if out is not chunk else None, metadata)]
            if kind == REQUEST_BODY:
                return self._request_body(msg)
            if kind == REQUEST_HEADERS:
                return self._request_headers(msg)
            if kind == RESPONSE_HEADERS:
                if self._evicted:
                    return self._end_evicted()
                return self._response_headers(msg)
            if kind == REQUEST_TRAILERS:
                return self._request_trailers()
            if kind == RESPONSE_TRAILERS:
                return self._response_trailers()
        except Exception as e:
            return self._failed(e, KIND_NAMES.get(kind, str(kind)))
        return []

    async def route(self) -> list[responses.Reply]:
        """Route the request whose body ``handle`` completed; the replies to that message."""
        self.route_pending = False
        by_trailers = self._ended_by_trailers
        try:
            out = await self._route(end_of_stream=not by_trailers)
        except Exception as e:
            return self._failed(e, "request_trailers" if by_trailers else "request_body")
        if by_trailers:
            out.append(responses.EMPTY_REQUEST_TRAILERS)
        return out

    def close(self) -> None:
        """The call is over (ended, failed, cancelled or its connection lost): close the request."""
        if self.closed:
            return
        self.closed = True
        lc = self.lifecycle
        try:
            try:
                if lc is not None:
                    lc.close(self.error)
                    on_closed = lc.ctx.request.on_closed
                    if on_closed is not None:  # flow control tracked it for eviction
                        on_closed()
            finally:
                if self.trace is not None:
                    self._tracing.end_request(self.trace)
        except Exception:
            log.exception("session_close_failed", **self._log_ids())
        if self._on_close is not None:
            self._on_close()
        self._release(lc)

    def _release(self, lc: RequestLifecycle | None) -> None:
        """Let reference counting free the closed request's objects now.

        The request points back at this session (``edge``), this session at its transport
        (``writer``), and the transport's call and driver at each other: without these cuts
        every request's ~25 objects (context, cycle state, parsed body, scheduling result...)
        would wait in reference cycles for the cyclic collector, which then scans them all
        (a gen-0 pass every ~25 requests: ~6 µs a request in bench/hotpath).  The session
        itself may stay with its transport until that collector runs; it keeps nothing.
        """
        self.writer = None
        self.lifecycle = None
        self._body = []
        if lc is not None:
            lc.ctx.request.edge = None

    # request phases ---------------------------------------------------------------
    def _request_headers(self, msg: Incoming) -> list[responses.Reply]:
        config = msg.config
        if config is not None:
            self.request_mode = config.request_body_mode
            self.response_mode = config.response_body_mode
            self._config = config
        headers = msg.headers
        assert headers is not None  # a headers message always has its map
        if self._tracing.enabled:
            self.trace = self._tracing.start_request(headers)
        full_duplex_response = self.response_mode == FULL_DUPLEX
        metadata = msg.metadata
        lc = self.lifecycle = self._director.start(
            headers, metadata if metadata is not None else {}, can_hold_response=full_duplex_response
        )
        if full_duplex_response:  # Envoy sends every response message: eviction can end it
            lc.ctx.request.edge = self
        mode = self.request_mode
        if msg.end_of_stream or mode in (NONE, STREAMED, BUFFERED_PARTIAL):
            decision = lc.route_headers_only()  # any body that follows is passed through
            reply = responses.routing_headers_response(
                decision.destination, None, self._upstream_headers(decision)
            )
            return [reply + self._skip_response_override(lc)]
        if mode == BUFFERED:
            return [_EMPTY_REQUEST_HEADERS_BYTES + self._skip_response_override(lc)]
        return []

    def _skip_response_override(self, lc: RequestLifecycle) -> bytes:
        """``ProcessingResponse.mode_override`` asking Envoy not to send the response (its headers
        too when no plugin reads them), or b"".

        Only when nothing in the EPP needs it, and only where Envoy honours it (``overridable``):
        an override Envoy would ignore is bytes for nothing.  Protobuf fields concatenate, so the
        precomputed field is appended to the reply's bytes.  Asked here, not when the config
        arrives: a FULL_DUPLEX_STREAMED request body (GIE's mode) never gets here.
        """
        config = self._config
        if config is None or not overridable(config) or lc.response_body_needed:
            return b""
        return lean_override(self.request_mode, headers=lc.response_headers_needed)

    def _request_body(self, msg: Incoming) -> list[responses.Reply]:
        lc = self.lifecycle
        if lc is None:
            raise BadRequest("request body received before request headers")
        if lc.phase >= ROUTED:  # routed from headers (STREAMED mode): echo
            return _echo(msg.body, msg.end_of_stream, self.request_mode, request=True)
        chunk = msg.body
        if chunk:
            self._body_size += len(chunk)
            if self._max_body and self._body_size > self._max_body:
                raise PayloadTooLarge(f"request body exceeds the limit of {self._max_body} bytes")
            self._body.append(chunk)
        if msg.metadata is not None:  # GIE: metadata of the body-completing message wins
            lc.set_metadata(msg.metadata)
        if msg.end_of_stream:
            self.route_pending = True
        return []

    def _request_trailers(self) -> list[responses.Reply]:
        """Trailers end a body that had no end_of_stream: route now.  GIE sends nothing (and hangs)."""
        lc = self.lifecycle
        if lc is not None and lc.phase is Phase.RECEIVING:
            self._ended_by_trailers = True
            self.route_pending = True
            return []
        return [responses.EMPTY_REQUEST_TRAILERS]

    async def _route(self, *, end_of_stream: bool) -> list[responses.Reply]:
        lc = self.lifecycle
        assert lc is not None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        if self._tracing.enabled:
            span = self._tracing.start_orchestration(self.trace)
            lc.ctx.stages = self._tracing.stages(span)
            try:
                decision = await lc.route(body)
            finally:
                req = lc.request
                self._tracing.end_orchestration(span, target_model=req.target_model, priority=req.priority)
        else:
            decision = await lc.route(body)
        headers = decision.headers if self.trace is None else self._upstream_headers(decision)
        out_body = decision.body if decision.body is not None else body
        if self.request_mode == FULL_DUPLEX:
            n = len(out_body)
            reply = responses.routing_headers_response(
                decision.destination,
                n,
                headers,
                decision.scores,
                decision.remove_headers,
                decision.breakdown,
            )
            if n <= responses.BODY_CHUNK_LIMIT:  # the usual body: one mutation, no list to extend
                return [reply, wire.body_reply(out_body, end_of_stream, True)]
            return [reply, *responses.streamed_body(out_body, request=True, end_of_stream=end_of_stream)]
        changed = decision.body_changed
        return [
            responses.routing_body_response(
                decision.destination,
                out_body if changed else None,
                len(out_body) if changed else None,
                headers,
                decision.scores,
                decision.remove_headers,
                decision.breakdown,
            )
        ]

    def _upstream_headers(self, decision: RoutingDecision) -> tuple[tuple[str, str], ...]:
        if self.trace is None:
            return decision.headers
        return (*decision.headers, *self._tracing.inject(self.trace))

    # response phases --------------------------------------------------------------
    def _response_headers(self, msg: Incoming) -> list[responses.Reply]:
        lc = self.lifecycle
        if lc is None:  # a response-only session (GIE ReqResponseOnly): nothing to account
            return [responses.response_headers_reply(())]
        if msg.metadata is not None:  # e.g. envoy.lb's destination-endpoint-served
            lc.set_metadata(msg.metadata)
        headers = msg.headers
        assert headers is not None  # a headers message always has its map
        added = lc.response_headers(headers, end_of_stream=msg.end_of_stream)
        return [responses.response_headers_reply(added)]

    def _response_trailers(self) -> list[responses.Reply]:
        """gRPC responses end with trailers: flush a held body (without end_of_stream) and finish."""
        out: list[responses.Reply] = []
        lc = self.lifecycle
        if lc is not None:
            held = lc.response_end()
            if held is not None:
                out.extend(responses.streamed_response_body(held, False))
        out.append(responses.EMPTY_RESPONSE_TRAILERS)
        return out

    # in-flight eviction -------------------------------------------------------------
    def evict(self) -> None:
        """Flow control evicted the request (``epp.request.Evictable``): upstream's ImmediateResponse
        ends it, written at once where the transport can (``push``), else in answer to the next
        response message Envoy sends (a 429 before the response headers went downstream; a
        reset stream after, which also resets the model server's connection)."""
        self._evicted = True
        if self.writer is not None and not self.finished:
            self.writer.write_unasked()  # the transport writes ``take_eviction()`` now if it can

    def take_eviction(self) -> list[responses.Reply]:
        """The eviction reply, for a transport writing it unasked; [] when there is none to send."""
        if not self._evicted or self.finished or self.lifecycle is None:
            return []
        return self._end_evicted()

    def _end_evicted(self) -> list[responses.Reply]:
        self.finished = True
        self.error = ResourceExhausted(EVICTED_BODY.decode(), reason=EVICTED_REASON)
        log.info("request_evicted", **self._log_ids())
        return [_EVICTED_REPLY]

    # errors -----------------------------------------------------------------------
    def _failed(self, e: Exception, kind: str | None) -> list[responses.Reply]:
        self.finished = True
        self.route_pending = False
        if isinstance(e, EppError):
            self.error = e
            log.info("request_failed", code=e.code, reason=e.reason, error=e.msg, **self._log_ids())
            return [responses.immediate_error(e)]
        err = Internal("internal error while processing the request")
        self.error = err
        log.exception("request_crashed", phase=kind, error=repr(e), **self._log_ids())  # in an except
        return [responses.immediate_error(err)]

    def _log_ids(self) -> dict[str, str]:
        lc = self.lifecycle
        return {"request_id": lc.request.request_id} if lc is not None else {}


def _echo(chunk: bytes, eos: bool, mode: int, *, request: bool) -> list[responses.Reply]:
    """Pass a chunk through unchanged (streams the EPP does not process)."""
    if mode == FULL_DUPLEX:
        return list[responses.Reply](responses.streamed_body(chunk, request=request, end_of_stream=eos))
    return [responses.EMPTY_REQUEST_BODY if request else responses.EMPTY_RESPONSE_BODY]
