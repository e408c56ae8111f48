"""The plugins one director runs, shared by its routing side (director.py) and response side (response.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from epp.admission.api import AdmissionController
from epp.datalayer.api import Endpoint
from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
)
from epp.explain.record import DecisionRing
from epp.parsers.api import Parser
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult

DEFAULT_PRODUCER_TIMEOUT: Final = 0.4


class SchedulerLike(Protocol):
    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """The plugins a director runs, already ordered (producers topologically, the rest by config)."""

    parser: Parser
    scheduler: SchedulerLike
    admission: AdmissionController
    producers: tuple[DataProducer, ...] = ()
    admitters: tuple[Admitter, ...] = ()
    pre_request: tuple[PreRequest, ...] = ()
    response_header: tuple[ResponseHeaderProcessor, ...] = ()
    response_body: tuple[ResponseBodyProcessor, ...] = ()
    response_complete: tuple[ResponseCompleteProcessor, ...] = ()
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
