"""Per-request state the director keeps between the request and response phases."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.datalayer.api import Endpoint
from epp.parsers.api import UsageParser
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult


@dataclass(slots=True, frozen=True)
class RoutingDecision:
    """What the ext_proc edge tells Envoy: where to send the request, and with which body."""

    destination: str  # "ip:port[,ip:port...]": primary first, then fallbacks
    body: bytes | None  # the body to forward; None for header-only requests
    body_changed: bool  # False: forward the received bytes as they are
    headers: tuple[tuple[str, str], ...] = ()  # extra headers to set upstream (trace context, request id)


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request's journey; lives from the request headers to the end of the ext_proc stream."""

    request: InferenceRequest
    state: CycleState = field(default_factory=CycleState)
    result: SchedulingResult | None = None
    target: Endpoint | None = None
    response: ResponseInfo | None = None
    usage_parser: UsageParser | None = None
    scheduled: bool = False  # routed with a body through the scheduler (metrics and hooks apply)
    running_counted: bool = False  # incremented inference_objective_running_requests
    completed: bool = False  # completion hooks ran
    rewrite_response_model: bool = False  # the response carries the target model; show the client's
    error_code: str = ""  # first error code seen (request_error_total is recorded once)
    generated_request_id: bool = False
