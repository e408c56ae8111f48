"""Contracts of the request-control plugins (GIE's requestcontrol extension points).

Hook order is deterministic: producers run in DAG order; every other hook kind runs in
config order (the order of ``plugins:``), unlike Go, which uses map order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.plugin.base import Plugin
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState

# The request's agent identity: defined beside the request (the session-affinity plugins read it
# too); request-header plugins import it from here.
from epp.request import AGENT_IDENTITY as AGENT_IDENTITY
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult


@runtime_checkable
class Consumer(Protocol):
    """Anything (producer, filter, scorer) that reads per-endpoint attributes."""

    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]]


@runtime_checkable
class RequestHeaderProcessor(Plugin, Protocol):
    """Runs once the request is parsed (model rewritten, priority known), before admission.

    llm-d-router's ``RequestHeaderProcessor``: it reads the request (headers) and publishes
    request-level values in the cycle state, e.g. ``AGENT_IDENTITY``, which decides the
    fairness id flow control queues the request under.  It must not block; an exception fails
    the request (upstream returns the error).
    """

    def request_header(self, state: CycleState, request: InferenceRequest) -> None: ...


@runtime_checkable
class Screener(Plugin, Protocol):
    """Cuts the located candidates once per request, before data production and every profile.

    llm-d-router's ``requestcontrol.Screener``: a constraint that no later filter, scorer or
    picker may undo, and that every scheduling profile (P/D's prefill and decode alike) sees
    the same way (e.g. one ``DisaggregatedSet`` revision per request).  Every screener gets the
    same candidates; the director keeps the endpoints all of them returned (the intersection,
    in candidate order), and an empty result fails the request with 503 (upstream: "screeners
    eliminated all endpoint candidates").

    ``pool`` is ours: the datastore's endpoints (the pool's Ready pods), for a screener whose
    decision depends on the whole pool rather than on the request's candidates.  Upstream
    plugins watch Pods themselves; plugins here have no Pod watch of their own.
    """

    def screen(
        self,
        state: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        pool: Sequence[Endpoint],
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class DataProducer(Plugin, Protocol):
    """Writes per-endpoint attributes for one request before scheduling.

    Producers run in topological order of PRODUCES/CONSUMES on the director's shared budget, or
    under the timeout one declares (``TimeoutAwareProducer.produce_timeout``); a failure or a
    timeout is logged and the request goes on without that data.
    """

    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]]
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]]

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None: ...


class ImmediateProducer(Protocol):
    """A producer that never waits may offer its work as a plain call as well.

    The director then calls ``prepare_request_data_now`` instead of creating, stepping and
    finishing a coroutine (~4k instructions a producer a request); same arguments, same
    effect, and a failure is logged the same way.  Optional: looked up once per pipeline.
    """

    def prepare_request_data_now(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None: ...


@runtime_checkable
class TimeoutAwareProducer(Protocol):
    """A producer that declares its own timeout (llm-d-router's ``TimeoutAwareProducer``).

    A producer that waits by design (``burst-prefix-cache-producer`` holds each request for its
    window) would otherwise be cut at the director's default.  Seconds; a value <= 0 selects
    the default.  Read once when the pipeline is built.
    """

    def produce_timeout(self) -> float: ...


@runtime_checkable
class Admitter(Plugin, Protocol):
    """May refuse a request after data preparation; returns the denial reason or None."""

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> str | None: ...


# A plugin class may set ``AFTER_REPLY = True`` (a class attribute, read once when the pipeline
# is built; not part of the protocols below): its PreRequest, ResponseHeaderProcessor,
# ResponseBodyProcessor and ResponseCompleteProcessor hooks never change what the EPP answers
# Envoy (no header added, no header mutation asked for, no dynamic metadata, no body change):
# they only record (counters, indexes, metrics).  When every hook of a kind in the pipeline
# declares it, the EPP may run them just after the reply they follow is written, off the
# request's critical path (director.after_reply): in order, before the next request is routed,
# and a failure is logged instead of failing a request whose reply is already gone.


@runtime_checkable
class PreRequest(Plugin, Protocol):
    """Runs once the target is chosen, before the request is sent on (or, for ``AFTER_REPLY``
    plugins, just after the routing reply is written; always before the next request is routed)."""

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseHeaderProcessor(Plugin, Protocol):
    """Sees the model server's response headers; may add to ``response.headers``."""

    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None: ...


@runtime_checkable
class ResponseBodyProcessor(Plugin, Protocol):
    """Sees every response body chunk.  Only plugins that need the bytes should be one:
    when no configured plugin is, the EPP may skip response bodies altogether.

    A plugin whose class sets ``FIRST_BYTE_ONLY = True`` acts on the first body byte only (a
    prefill is done): it is called, in its place among the others, until the first non-empty
    chunk (or the end of a bodiless response) has been handed to it, and not for the chunks
    after, which would each cost it a call and two clock reads for nothing (the response side
    reads the flag once, when the pipeline is built; it is not part of the protocol).
    """

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None: ...


@runtime_checkable
class ResponseCompleteProcessor(Plugin, Protocol):
    """Runs exactly once per scheduled request when its response ends, normally or not.

    ``response.end_of_stream`` tells which; ``response.usage`` holds the parsed usage if
    any.  Dynamic metadata written to ``response.dynamic_metadata`` rides on the final
    ext_proc message when the response ended normally.
    """

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None: ...
