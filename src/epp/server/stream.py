"""One ext_proc stream (= one HTTP request): the phase state machine of GIE §2.2.

Each ``on_*`` method consumes one ProcessingRequest part and returns the replies to send
(possibly none).  Body modes come from ``protocol_config`` on the first message:

* FULL_DUPLEX_STREAMED (GIE's mode): request headers are held until the body ends; then
  the routing headers reply and the body as <= 62,000-byte streamed mutations.
* BUFFERED: the headers are answered at once (Envoy then sends the whole
  body); the body reply carries the routing header mutation.  This mode fails open.
* STREAMED / BUFFERED_PARTIAL / NONE: Envoy applies routing headers only before the body
  (or only in BUFFERED mode), so the request is routed from its headers alone, like a GET,
  and any body is passed through untouched.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import structlog

from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.director.context import RequestContext, RoutingDecision
from epp.director.director import Director
from epp.errors import BadRequest, EppError, PayloadTooLarge
from epp.server import responses as r
from epp.server import wire
from epp.tracing.otel import RequestTrace, Tracing

log = structlog.get_logger(__name__)
_NO_TRACING = Tracing()
_EMPTY_REQUEST_HEADERS_BYTES: Final = r.EMPTY_REQUEST_HEADERS.SerializeToString()

FULL_DUPLEX: Final = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED: Final = mode_pb.ProcessingMode.BUFFERED
BUFFERED_PARTIAL: Final = mode_pb.ProcessingMode.BUFFERED_PARTIAL
STREAMED: Final = mode_pb.ProcessingMode.STREAMED
NONE: Final = mode_pb.ProcessingMode.NONE


class Phase(enum.IntEnum):
    """GIE's stream states (trailer states unused there too)."""

    REQUEST_RECEIVED = 0
    REQUEST_HEADERS_DONE = 1
    REQUEST_BODY_DONE = 2
    RESPONSE_RECEIVED = 4
    RESPONSE_HEADERS_DONE = 5
    RESPONSE_BODY_DONE = 6


def headers_to_dict(hm: Any) -> dict[str, str]:
    """Envoy header map → dict with lower-cased keys; ``raw_value`` wins over ``value``."""
    out: dict[str, str] = {}
    for h in hm.headers:
        raw = h.raw_value
        out[h.key.lower()] = raw.decode("utf-8", "replace") if raw else h.value
    return out


class Stream:
    """State for one ext_proc stream."""

    __slots__ = (
        "_body",
        "_body_size",
        "_director",
        "_max_body",
        "_resp_body",
        "_resp_buffered",
        "_tracing",
        "ctx",
        "error",
        "phase",
        "request_mode",
        "response_mode",
        "trace",
    )

    def __init__(
        self, director: Director, *, max_body_bytes: int = 0, tracing: Tracing | None = None
    ) -> None:
        self._director = director
        self._max_body = max_body_bytes
        self._tracing = tracing or _NO_TRACING
        self.trace: RequestTrace | None = None
        self._body: list[bytes] = []
        self._body_size = 0
        self._resp_body: list[bytes] = []
        self._resp_buffered = False
        self.ctx: RequestContext | None = None
        self.error: EppError | None = None
        self.phase = Phase.REQUEST_RECEIVED
        self.request_mode: int = FULL_DUPLEX
        self.response_mode: int = FULL_DUPLEX

    # request phases ---------------------------------------------------------------
    def on_request_headers(self, msg: pb.ProcessingRequest) -> list[r.Reply]:
        if msg.HasField("protocol_config"):
            pc = msg.protocol_config
            self.request_mode = pc.request_body_mode
            self.response_mode = pc.response_body_mode
        rh = msg.request_headers
        metadata = _metadata(msg)
        headers = headers_to_dict(rh.headers)
        if self._tracing.enabled:
            self.trace = self._tracing.start_request(headers)
        ctx = self.ctx = self._director.new_request(headers, metadata)
        self.phase = Phase.REQUEST_HEADERS_DONE
        mode = self.request_mode
        if rh.end_of_stream or mode in (NONE, STREAMED, BUFFERED_PARTIAL):
            decision = self._director.route_headers_only(ctx)
            self._director.request_sent(ctx)
            self.phase = Phase.REQUEST_BODY_DONE  # routed: any body that follows is passed through
            reply = r.routing_headers_response(decision.destination, None, self._upstream_headers(decision))
            return [reply + self._skip_response_override()]
        if mode == BUFFERED:
            return [_EMPTY_REQUEST_HEADERS_BYTES + self._skip_response_override()]
        return []

    def _skippable(self) -> bool:
        """Envoy honours mode_override only when neither body mode is FULL_DUPLEX_STREAMED."""
        return self.request_mode != FULL_DUPLEX and self.response_mode != FULL_DUPLEX

    def _skip_response_override(self) -> bytes:
        """``ProcessingResponse.mode_override`` asking Envoy not to send the response (its headers
        too when no plugin reads them), or b"".

        Only when nothing in the EPP needs it, and effective only with ``allow_mode_override:
        true`` and non-full-duplex body modes (protobuf fields concatenate, so the field is
        appended to the reply's bytes).  The request-side modes are restated because the
        override replaces the whole mode.
        """
        ctx = self.ctx
        if ctx is None or not self._skippable() or self._director.response_body_needed(ctx):
            return b""
        mode = mode_pb.ProcessingMode(
            request_header_mode=mode_pb.ProcessingMode.SEND,
            request_body_mode=self.request_mode,  # type: ignore[arg-type]
            request_trailer_mode=mode_pb.ProcessingMode.SKIP,
            response_header_mode=mode_pb.ProcessingMode.SEND
            if self._director.response_headers_needed
            else mode_pb.ProcessingMode.SKIP,
            response_body_mode=NONE,
            response_trailer_mode=mode_pb.ProcessingMode.SKIP,
        )
        return wire.field(b"\x4a", mode.SerializeToString())  # ProcessingResponse.mode_override = 9

    async def on_request_body(self, msg: pb.ProcessingRequest) -> list[r.Reply]:
        ctx = self.ctx
        hb = msg.request_body
        if ctx is None:
            raise BadRequest("request body received before request headers")
        if self.phase >= Phase.REQUEST_BODY_DONE:  # routed from headers (STREAMED mode): echo
            return _echo(hb.body, hb.end_of_stream, self.request_mode, request=True)
        chunk = hb.body
        if chunk:
            self._body_size += len(chunk)
            if self._max_body and self._body_size > self._max_body:
                raise PayloadTooLarge(f"request body exceeds the limit of {self._max_body} bytes")
            self._body.append(chunk)
        if msg.HasField("metadata_context"):  # GIE: metadata of the body-completing message wins
            ctx.request.metadata = _metadata(msg)
        if not hb.end_of_stream:
            return []
        return await self._route()

    async def on_request_trailers(self) -> list[r.Reply]:
        """Trailers end a body that had no end_of_stream: route now.  GIE sends nothing (and hangs)."""
        out: list[r.Reply] = []
        if self.ctx is not None and self.phase < Phase.REQUEST_BODY_DONE:
            out.extend(await self._route(end_of_stream=False))
        out.append(r.EMPTY_REQUEST_TRAILERS)
        return out

    async def _route(self, *, end_of_stream: bool = True) -> list[r.Reply]:
        ctx = self.ctx
        assert ctx is not None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        if self._tracing.enabled:
            span = self._tracing.start_orchestration(self.trace)
            try:
                decision = await self._director.route(ctx, body)
            finally:
                req = ctx.request
                self._tracing.end_orchestration(span, target_model=req.target_model, priority=req.priority)
        else:
            decision = await self._director.route(ctx, body)
        self.phase = Phase.REQUEST_BODY_DONE
        headers = self._upstream_headers(decision)
        out_body = decision.body if decision.body is not None else body
        if self.request_mode == FULL_DUPLEX:
            out: list[r.Reply] = [r.routing_headers_response(decision.destination, len(out_body), headers)]
            out.extend(r.streamed_body(out_body, request=True, end_of_stream=end_of_stream))
        else:
            changed = decision.body_changed
            out = [
                r.routing_body_response(
                    decision.destination,
                    out_body if changed else None,
                    len(out_body) if changed else None,
                    headers,
                )
            ]
        self._director.request_sent(ctx)
        return out

    # response phases --------------------------------------------------------------
    def on_response_headers(self, msg: pb.ProcessingRequest) -> list[r.Reply]:
        ctx = self.ctx
        rh = msg.response_headers
        self.phase = Phase.RESPONSE_HEADERS_DONE
        if ctx is None:  # a response-only stream (GIE ReqResponseOnly): nothing to account
            return [r.response_headers_reply(())]
        if msg.HasField("metadata_context"):  # e.g. envoy.lb's destination-endpoint-served
            ctx.request.metadata = _metadata(msg)
        headers = headers_to_dict(rh.headers)
        before = dict(headers)
        self._director.response_headers(ctx, headers)
        added = [(k, v) for k, v in headers.items() if before.get(k) != v]  # new or overridden
        # Non-streamed bodies are buffered only when their model name must be restored.
        self._resp_buffered = ctx.rewrite_response_model and not (ctx.response and ctx.response.streaming)
        if rh.end_of_stream:
            self._director.response_body(ctx, b"", True)
            self.phase = Phase.RESPONSE_BODY_DONE
        return [r.response_headers_reply(added)]

    def on_response_body(self, msg: pb.ProcessingRequest) -> list[r.Reply]:
        hb = msg.response_body
        chunk, eos = hb.body, hb.end_of_stream
        ctx = self.ctx
        mode = self.response_mode
        if ctx is None:
            return _echo(chunk, eos, mode, request=False)
        if self._resp_buffered and mode == FULL_DUPLEX:
            if chunk:
                self._resp_body.append(chunk)
            if not eos:
                return []
            whole = b"".join(self._resp_body)
            self._resp_body = []
            out_chunk = self._director.response_body(ctx, whole, True)
            self.phase = Phase.RESPONSE_BODY_DONE
            return r.streamed_response_body(out_chunk, True, _final_metadata(ctx))
        out_chunk = self._director.response_body(ctx, chunk, eos)
        md = _final_metadata(ctx) if eos else None
        if eos:
            self.phase = Phase.RESPONSE_BODY_DONE
        if mode == FULL_DUPLEX:
            return r.streamed_response_body(out_chunk, eos, md)
        return [r.replaced_response_body(out_chunk if out_chunk is not chunk else None, md)]

    def on_response_trailers(self) -> list[r.Reply]:
        """gRPC responses end with trailers: flush a held body (without end_of_stream) and finish."""
        out: list[r.Reply] = []
        ctx = self.ctx
        if ctx is not None and self.phase < Phase.RESPONSE_BODY_DONE:
            if self._resp_buffered and self._resp_body:
                whole = b"".join(self._resp_body)
                self._resp_body = []
                out.extend(r.streamed_response_body(self._director.response_body(ctx, whole, True), False))
            else:
                self._director.response_body(ctx, b"", True)
            self.phase = Phase.RESPONSE_BODY_DONE
        out.append(r.EMPTY_RESPONSE_TRAILERS)
        return out

    def _upstream_headers(self, decision: RoutingDecision) -> tuple[tuple[str, str], ...]:
        if self.trace is None:
            return decision.headers
        return (*decision.headers, *self._tracing.inject(self.trace))

    def close(self) -> None:
        """The stream is over: finish the request exactly once, whatever happened."""
        try:
            if self.ctx is not None:
                self._director.finish(self.ctx, self.error)
        finally:
            if self.trace is not None:
                self._tracing.end_request(self.trace)


def _final_metadata(ctx: RequestContext) -> dict[str, Any] | None:
    resp = ctx.response
    return resp.dynamic_metadata if resp is not None and resp.dynamic_metadata else None


def _metadata(msg: pb.ProcessingRequest) -> dict[str, Any]:
    if not msg.HasField("metadata_context"):
        return {}
    fm = msg.metadata_context.filter_metadata
    return {ns: r.struct_to_python(s) for ns, s in fm.items()} if fm else {}


def _echo(chunk: bytes, eos: bool, mode: int, *, request: bool) -> list[r.Reply]:
    """Pass a chunk through unchanged (streams the EPP does not process)."""
    if mode == FULL_DUPLEX:
        return list[r.Reply](r.streamed_body(chunk, request=request, end_of_stream=eos))
    return [r.EMPTY_REQUEST_BODY if request else r.EMPTY_RESPONSE_BODY]
