"""Per-request data: what routing hands the edge, and what the director keeps about a request.

``RoutingDecision`` is what the ext_proc edge tells Envoy.  ``RequestContext`` lives from the
request headers to the end of the stream: what a request *is* and what routing learned about
it; where it *is* in its lifecycle is ``RequestLifecycle.phase`` (lifecycle.py), kept nowhere
else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from epp.datalayer.api import Endpoint
from epp.explain.record import Decision
from epp.metrics.fast import GaugeChild
from epp.parsers.api import Parser, UsageParser
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult
from epp.tracing.stages import StageSpans

# A bare instance for the hot constructors (``RoutingDecision.plain``, ``RequestContext.started``).
_new: Final = object.__new__


@dataclass(slots=True, eq=False)
class RoutingDecision:
    """What the ext_proc edge tells Envoy: where to send the request, and with which body.

    Built once per request by the director and only read by the edge; not frozen, because a
    frozen dataclass sets each field through ``object.__setattr__`` (1.10 -> 0.52 µs a request).
    """

    destination: str  # "ip:port[,ip:port...]": primary first, then fallbacks
    body: bytes | None  # the body to forward; None for header-only requests
    body_changed: bool  # False: forward the received bytes as they are
    headers: tuple[tuple[str, str], ...] = ()  # extra headers to set upstream (trace context, request id)
    scores: Mapping[str, float] | None = None  # ip:port -> final score (--emit-endpoint-scores)
    # ip:port -> {scorer name: weighted score}: the primary profile's per-scorer breakdown
    breakdown: Mapping[str, Mapping[str, float]] | None = None
    remove_headers: tuple[str, ...] = ()  # request headers to strip upstream (a client's P/D header)

    @classmethod
    def plain(
        cls,
        destination: str,
        body: bytes | None,
        body_changed: bool,
        headers: tuple[tuple[str, str], ...],
        remove_headers: tuple[str, ...],
    ) -> RoutingDecision:
        """A decision without scores or breakdown (a request not explained): every request's.

        Each slot set once on a bare object: calling the class with keywords passes them to the
        dataclass ``__init__`` as a dict (4.6k instructions, ~1.8k this way).
        tests/director/test_context.py holds it equal to the keyword constructor.
        """
        d: RoutingDecision = _new(cls)
        d.destination = destination
        d.body = body
        d.body_changed = body_changed
        d.headers = headers
        d.scores = None
        d.breakdown = None
        d.remove_headers = remove_headers
        return d


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request's data; lives from the request headers to the end of the ext_proc stream."""

    request: InferenceRequest
    state: CycleState = field(default_factory=CycleState)
    # Set once the scheduler chose for a request with a body: from then on the request is
    # "scheduled" (completion hooks and response metrics apply, also if a later step fails).
    result: SchedulingResult | None = None
    target: Endpoint | None = None
    response: ResponseInfo | None = None
    parser: Parser | None = None  # the parser that read the request; its response side too
    usage_parser: UsageParser | None = None
    rewrite_response_model: bool = False  # the response carries the target model; show the client's
    error_code: str = ""  # first error code seen (request_error_total is recorded once)
    error_reason: str = ""  # its machine-readable reason (errors.EppError.reason; model-server-error)
    generated_request_id: bool = False
    stages: StageSpans | None = None  # set by the edge for a sampled request: spans per routing stage
    explain_asked: bool = False  # the trusted explain header asked for the per-scorer breakdown
    explain_header: str = ""  # the response header's value for such a request, once routed
    record: Decision | None = None  # --decisions-buffer-size: filled while routing, then committed
    # The running-requests series that counted this request (ResponseSide.request_sent), so the
    # end of the request lowers that very series without looking it up again.
    running: GaugeChild | None = None
    # The pre-request hooks (and the request's metrics) wait for the routing reply to be written:
    # ``RequestLifecycle.route`` queues them with the request's own bookkeeping (director.after_reply).
    hooks_later: bool = False

    @classmethod
    def started(cls, request: InferenceRequest, generated_request_id: bool) -> RequestContext:
        """A request's context as ``Director.start`` makes it, every other field at its default.

        Each slot set once on a bare object, as ``RoutingDecision.plain`` (6.2k instructions
        with keywords and the default factory, ~4k this way, most of it the CycleState).
        tests/director/test_context.py holds it equal to the keyword constructor.
        """
        c: RequestContext = _new(cls)
        c.request = request
        c.state = CycleState()
        c.result = None
        c.target = None
        c.response = None
        c.parser = None
        c.usage_parser = None
        c.rewrite_response_model = False
        c.error_code = ""
        c.error_reason = ""
        c.generated_request_id = generated_request_id
        c.stages = None
        c.explain_asked = False
        c.explain_header = ""
        c.record = None
        c.running = None
        c.hooks_later = False
        return c
