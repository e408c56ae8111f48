"""What one director runs, shared by its routing side (director.py) and response side (response.py).

Two things, one name each, because they are known at different times:

- ``RequestControl`` (GIE's request-control extension points): the parser and the plugins of
  each hook, ordered.  The config file alone decides it (``config.build`` makes it).
- ``Pipeline``: those hooks plus what only the running EPP has: the scheduler, the admission
  controller (it needs the datastore) and the command line's tuning.  ``RequestControl.pipeline``
  makes one; ``Director.swap`` takes a new one on a config reload.

``Pipeline`` extends ``RequestControl``, so the hook fields are declared once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Protocol

from epp.admission.api import AdmissionController
from epp.datalayer.api import Endpoint
from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    RequestHeaderProcessor,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
    Screener,
)
from epp.explain.record import DecisionRing
from epp.parsers.api import Parser
from epp.parsers.registry import ParserRegistry
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult

DEFAULT_PRODUCER_TIMEOUT: Final = 0.4


class SchedulerLike(Protocol):
    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestControl:
    """The parser and the plugins of every request-control extension point, ordered.

    Hook tuples follow plugin creation order (config order, then defaults); a plugin
    implementing several protocols is in several tuples.  ``producers`` are in DAG order.
    """

    parser: Parser | ParserRegistry  # a registry when several parsers are listed (per-path)
    request_header: tuple[RequestHeaderProcessor, ...] = ()  # before admission (fairness id)
    screeners: tuple[Screener, ...] = ()  # after the candidates, before producers and profiles
    producers: tuple[DataProducer, ...] = ()
    admitters: tuple[Admitter, ...] = ()
    pre_request: tuple[PreRequest, ...] = ()
    response_header: tuple[ResponseHeaderProcessor, ...] = ()
    response_body: tuple[ResponseBodyProcessor, ...] = ()
    response_complete: tuple[ResponseCompleteProcessor, ...] = ()

    def pipeline(
        self, *, scheduler: SchedulerLike, admission: AdmissionController, **options: Any
    ) -> Pipeline:
        """The director's pipeline: these hooks; ``options`` are ``Pipeline``'s tuning fields."""
        hooks = {f.name: getattr(self, f.name) for f in fields(RequestControl)}
        return Pipeline(scheduler=scheduler, admission=admission, **hooks, **options)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline(RequestControl):
    """Everything a director runs for a request, plugins already ordered (producers in DAG order).

    The hooks are ``RequestControl``'s fields; the scheduler, the admission controller and the
    tuning (flags) are added here.
    """

    scheduler: SchedulerLike
    admission: AdmissionController
    producer_timeout: float = DEFAULT_PRODUCER_TIMEOUT
    subset_filter: bool = True
    # Endpoints whose metrics are older than this are not candidates while a fresh one
    # exists (0 disables): a dead or unreachable server stops attracting traffic once its
    # last scrape ages out, and an endpoint joins once it has been scraped.
    staleness_threshold: float = 0.0
    emit_endpoint_scores: bool = False  # llm-d-router's --emit-endpoint-scores
    # A request carrying this header (set by a trusted gateway) gets its per-scorer scores in
    # the envoy.lb metadata and a response header (--explain-request-header; "" = off).
    explain_header: str = ""
    decisions: DecisionRing | None = None  # the last N decisions (--decisions-buffer-size; None = off)
