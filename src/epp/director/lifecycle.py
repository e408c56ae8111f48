"""One request's lifecycle: the object the director hands out per request, and its one state.

A request passes through routing (director.py) and then its response (response.py), and
each step has rules about order and repetition: a request is counted as running once it is
routed and uncounted once; completion hooks run exactly once for a scheduled request, also
when the stream dies mid-response; a non-streamed response whose model name must be
restored is held to its end so the name cannot straddle chunks.  Those rules used to be
split between the ext_proc edge (a phase enum, the buffering rule) and booleans on the
request context; here they are one ``Phase`` on one object, so the edge only translates
ext_proc messages and modes into calls on it:

    lc = director.start(headers, metadata, can_hold_response=...)
    decision = await lc.route(body)   |  lc.route_headers_only()
    added = lc.response_headers(headers, end_of_stream=...)
    out = lc.response_chunk(chunk, end_of_stream)   # None: held, nothing to forward yet
    out = lc.response_end()                          # trailers: flush what is held
    lc.close(error)                                  # always, exactly once

Every method is synchronous except ``route`` (admission and data producers may wait), which
is what lets the edge answer response chunks from the transport's read callback.

When the edge writes replies before running what does not shape them (director.after_reply),
a step whose hooks only record is kept on the lifecycle (``_later``) and the lifecycle queued
once; ``run_later`` then does the steps in order, after the reply is written: the routed
request's pre-request hooks and bookkeeping, the response headers', a chunk's read with them,
the last chunk's with the completion (a chunk read alone, a streamed token, is accounted at once:
queueing it for itself cost more than it saved).  Any step done at once first runs everything
queued before it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import structlog

from epp.director.context import RequestContext, RoutingDecision
from epp.director.response import ResponseSide
from epp.errors import EppError
from epp.explain.record import SCORES_HEADER
from epp.request import InferenceRequest

if TYPE_CHECKING:
    from epp.director.director import Director

log = structlog.get_logger(__name__)


class Phase(enum.IntEnum):
    """Where a request is; it only moves forward (a response may start without headers)."""

    RECEIVING = 0  # request headers in, body arriving; nothing decided (also: routing failed)
    ROUTED = 1  # the routing decision was handed out; a scheduled request counts as running
    RESPONDING = 2  # the response started (headers, or a chunk without headers)
    COMPLETE = 3  # the response ended; completion hooks ran
    CLOSED = 4  # the stream is over; the request's books are closed


# The members as module constants: reading one off the Enum class costs ~100 ns on Python 3.11,
# as much as the rest of a response chunk's bookkeeping in the lifecycle.
RECEIVING: Final = Phase.RECEIVING
ROUTED: Final = Phase.ROUTED
RESPONDING: Final = Phase.RESPONDING
COMPLETE: Final = Phase.COMPLETE
CLOSED: Final = Phase.CLOSED

# The steps ``run_later`` does, each kept as (step, argument, argument): identity-compared ints.
_ROUTED: Final = 0  # (the routed request's bookkeeping; pre-request hooks too if ``hooks_later``)
_HEADERS: Final = 1  # (headers, None)
_CHUNK: Final = 2  # (chunk, None): a chunk in mid-response read with the headers
_END: Final = 3  # (the last chunk, whether the completion runs too)
_STEP_NAMES: Final = ("routed", "response headers", "response chunk", "response end")


class RequestLifecycle:
    """One request from its headers to the end of its ext_proc stream.  Made by ``Director.start``."""

    __slots__ = ("_can_hold", "_director", "_held", "_later", "_responses", "ctx", "phase")

    def __init__(
        self, director: Director, responses: ResponseSide, ctx: RequestContext, can_hold_response: bool
    ) -> None:
        """``can_hold_response`` positional: a class called with a keyword passes it to ``__init__``
        in a dict (~1.5k instructions a request)."""
        self._director = director
        self._responses = responses
        self._can_hold = can_hold_response
        self._held: list[bytes] | None = None  # a response held to its end (see response_headers)
        self._later: list[tuple[int, Any, Any]] | None = None  # steps after their replies; None: not queued
        self.ctx = ctx
        self.phase: Phase = RECEIVING

    @property
    def request(self) -> InferenceRequest:
        return self.ctx.request

    @property
    def scheduled(self) -> bool:
        """Routed with a body through the scheduler: completion hooks and response metrics apply."""
        return self.ctx.result is not None

    @property
    def response_headers_needed(self) -> bool:
        """Whether a plugin reads response headers, or an explained request adds one to them."""
        return self._responses.headers_needed or self.ctx.explain_asked

    @property
    def response_body_needed(self) -> bool:
        """Whether the response body must reach the EPP (see ``ResponseSide.body_needed``)."""
        return self._responses.body_needed(self.ctx)

    def set_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Envoy's filter metadata of the latest message that carried some (GIE: the latest wins)."""
        self.ctx.request.metadata = metadata

    # request side -----------------------------------------------------------------
    async def route(self, body: bytes) -> RoutingDecision:
        """Route on the complete body.  Raises ``EppError``; the phase then stays RECEIVING.

        The phase test and ``_routed`` are written out here: each call is ~1k instructions on
        the path every request takes.
        """
        if self.phase is not RECEIVING:
            self._expect(RECEIVING, "route")  # raises
        ctx = self.ctx
        if ctx.record is None:
            decision = await self._director.route(ctx, body)
        else:  # --decisions-buffer-size: the decision is kept whether routing succeeded or not
            try:
                decision = await self._director.route(ctx, body)
            except BaseException as e:
                self._director.commit(ctx, e)
                raise
            self._director.commit(ctx, None)
        self.phase = ROUTED  # _routed
        if self._responses.after.enabled:  # counted once the reply is written
            self._step_later((_ROUTED, None, None))
        else:
            self._responses.request_sent(ctx)
        return decision

    def route_headers_only(self) -> RoutingDecision:
        """Route a request that has no body for the EPP (GET, or body modes that cannot carry one)."""
        self._expect(RECEIVING, "route")
        try:
            decision = self._director.route_headers_only(self.ctx)
        except BaseException as e:
            self._director.commit(self.ctx, e)
            raise
        self._director.commit(self.ctx, None)
        self._routed()
        return decision

    def _routed(self) -> None:
        self.phase = ROUTED
        self._responses.request_sent(self.ctx)

    # the steps that wait for their replies (director.after_reply) -------------------
    def _step_later(self, step: tuple[int, Any, Any]) -> None:
        later = self._later
        if later is not None:  # queued already: the step joins the others
            later.append(step)
            return
        self._later = [step]  # the first step since the queue last ran: queue the lifecycle
        after = self._responses.after
        if after.reading:  # ``after.defer(self)`` inlined: a call less on most steps
            after.queue.append(self)
        else:
            after.defer(self)

    def run_later(self) -> None:
        """Do the steps kept for after their replies, in order; a failing step is logged, the rest run."""
        steps, self._later = self._later, None
        if not steps:
            return
        ctx = self.ctx
        responses = self._responses
        # Each step's calls written out here, not behind helpers: a Python call is ~1k
        # instructions, and these run for every request.
        for step, a, b in steps:
            try:
                if step is _CHUNK:
                    responses.chunk(ctx, a, False)
                elif step is _HEADERS:
                    responses.headers(ctx, a)
                elif step is _ROUTED:
                    if ctx.hooks_later:  # the pre-request hooks and metrics the director left
                        req = ctx.request
                        result = ctx.result
                        assert result is not None  # hooks are left only for a scheduled request
                        self._director.pre_request(ctx.state, req, result, req.request_size_bytes)
                    responses.request_sent(ctx)
                else:  # _END: the completion runs even if the accounting fails (it releases)
                    try:
                        responses.chunk(ctx, a, True)
                    finally:
                        if b:
                            responses.complete(ctx)
            except Exception:
                log.exception("after_reply_failed", step=_STEP_NAMES[step], request_id=ctx.request.request_id)

    def _expect(self, phase: Phase, what: str) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"{what} in phase {self.phase.name}")

    # response side ----------------------------------------------------------------
    def response_headers(self, headers: dict[str, str], *, end_of_stream: bool) -> list[tuple[str, str]]:
        """The response headers; returns the headers that hooks added or changed."""
        ctx = self.ctx
        responses = self._responses
        after = responses.after
        before: dict[str, str] | None = None
        if (
            after.enabled
            and responses.headers_later
            and not (end_of_stream or ctx.rewrite_response_model or ctx.explain_header)
        ):
            self._step_later((_HEADERS, headers, None))  # nothing here changes the reply
        else:
            if after.queue:  # the steps deferred before this one first
                after.run()
            # Only hooks change ``headers`` (header hooks; body and completion hooks too when the
            # response ends here): without them there is nothing to compare, so no copy.
            if responses.headers_needed or end_of_stream:
                before = headers.copy()  # a method call: ``dict(...)`` costs twice as much
            responses.headers(ctx, headers)
        added: list[tuple[str, str]] = []
        if ctx.explain_header:  # the trusted explain header asked: the per-scorer breakdown
            if before is None and headers.get(SCORES_HEADER) != ctx.explain_header:
                added.append((SCORES_HEADER, ctx.explain_header))
            headers[SCORES_HEADER] = ctx.explain_header
        if self.phase < RESPONDING:
            self.phase = RESPONDING
        # Restoring the model name works chunk by chunk except in a non-streamed body, where the
        # name could straddle two chunks: hold such a body to its end when the edge can.
        if self._can_hold and ctx.rewrite_response_model and not (ctx.response and ctx.response.streaming):
            self._held = []
        if end_of_stream:
            self._final_chunk(b"")
        # Hooked, ``added`` is empty; unchanged headers (the usual case: the hooks only read them)
        # are found equal in one C comparison, not scanned header by header.
        if before is not None and headers != before:
            return [(k, v) for k, v in headers.items() if before.get(k) != v]  # new or overridden
        return added

    def response_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes | None:
        """One response body chunk; returns the bytes to forward now, or None while held.

        Unchanged chunks come back as the same object.  The common case (a chunk in mid
        response) is the first branch: this runs once per streamed token.
        """
        if self._held is None and not end_of_stream and self.phase is RESPONDING:
            responses = self._responses
            later = self._later
            if later is not None and responses.chunks_later and not self.ctx.rewrite_response_model:
                # This request's steps already wait in this read (its headers'): one more costs a
                # tuple.  A chunk read alone (a streamed token) is accounted at once: queueing it
                # cost ~0.6 µs more a token (bench.streaming) for a few µs of one token's wait.
                later.append((_CHUNK, chunk, None))
                return chunk
            after = responses.after
            if after.queue:  # the steps waiting from before, first
                after.run()
            return responses.chunk(self.ctx, chunk, False)
        held = self._held
        if held is not None:
            if chunk:
                held.append(chunk)
            if not end_of_stream:
                return None
            self._held = None
            chunk = held[0] if len(held) == 1 else b"".join(held)
        if end_of_stream:
            return self._final_chunk(chunk)
        if self.phase < RESPONDING:  # a body without headers
            self.phase = RESPONDING
        after = self._responses.after
        if after.queue:
            after.run()
        return self._responses.chunk(self.ctx, chunk, False)

    def response_end(self) -> bytes | None:
        """The response ended without an end-of-stream chunk (gRPC trailers): complete it.

        Returns a held body to forward (as a chunk without end_of_stream), or None.
        """
        if self.phase >= COMPLETE:
            return None
        held, self._held = self._held, None
        if held:
            return self._final_chunk(held[0] if len(held) == 1 else b"".join(held))
        self._final_chunk(b"")
        return None

    def _final_chunk(self, chunk: bytes) -> bytes:
        responses = self._responses
        after = responses.after
        ctx = self.ctx
        if after.enabled and responses.ends_later and not ctx.rewrite_response_model:
            # No hook can add metadata to this reply: the accounting and completion come after it.
            step = (_END, chunk, self.phase < COMPLETE)
            self.phase = COMPLETE
            after.hand_over = True  # Envoy forwards the response next (after_reply: it may go first)
            later = self._later
            if later is not None:  # ``_step_later`` inlined: the response's chunks queued it
                later.append(step)
            else:
                self._step_later(step)
            return chunk
        if after.queue:
            after.run()
        out = responses.chunk(ctx, chunk, True)
        if self.phase < COMPLETE:
            self.phase = COMPLETE
            responses.complete(ctx)
        return out

    @property
    def response_metadata(self) -> dict[str, Any] | None:
        """Dynamic metadata for the message that ends the response (completion hooks write it)."""
        resp = self.ctx.response
        return resp.dynamic_metadata if resp is not None and resp.dynamic_metadata else None

    def close(self, error: EppError | None = None) -> None:
        """The stream is over (normally, with ``error``, or cancelled).  Idempotent.

        A scheduled request whose response did not end still gets its completion hooks
        (they release what pre-request hooks took); the running gauge and the error count
        are settled once.
        """
        phase = self.phase
        if phase is CLOSED:
            return
        after = self._responses.after
        if after.queue:  # this request's deferred steps (and any before them) first
            after.run()
        self.phase = CLOSED
        self._held = None
        ctx = self.ctx
        if ctx.record is not None:  # never routed (e.g. a body over the limit): keep why
            self._director.commit(ctx, error)
        scheduled = ctx.result is not None
        if scheduled and phase < COMPLETE:
            self._responses.complete(ctx)
        running = scheduled and phase >= ROUTED and bool(ctx.request.incoming_model)
        self._responses.finish(ctx, error, running=running)
