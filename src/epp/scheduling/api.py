"""Contracts of the scheduling plugins and the nouns of a scheduling result.

Filters, scorers and pickers are plain ``def``: the scheduling hot path never awaits.
Scores travel as sequences aligned with the endpoint sequence they were computed for,
which avoids a dict per scorer per request.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint, Metrics
from epp.plugin.base import Plugin
from epp.plugin.state import CycleState
from epp.request import InferenceRequest


class ScorerCategory(enum.StrEnum):
    """Informational, as in GIE."""

    AFFINITY = "Affinity"
    DISTRIBUTION = "Distribution"
    BALANCE = "Balance"


@dataclass(frozen=True, slots=True)
class ProfileRunResult:
    """A profile's choice: the primary endpoint first, then fallbacks in order."""

    target_endpoints: tuple[Endpoint, ...]
    # Every candidate with its weighted total, only when the request asks (``request.explain``).
    scored: tuple[tuple[Endpoint, float], ...] = ()


@dataclass(frozen=True, slots=True)
class DisaggDecision:
    """What a disaggregating profile handler decided for one request (P/D, E/P/D).

    ``decision_type`` is llm-d's metric label (``decode-only``, ``prefill-decode``,
    ``encode-decode``, ``encode-prefill-decode``); ``reason`` says why prefill was or was
    not used (``disaggregated``, ``decider_declined``, ``no_prefill_decider``,
    ``no_prefill_profile``); ``prefill`` is the prefill target's ``ip:port`` or "".
    Response-side plugins read ``prefill_profile`` to know which result is the prefill leg.
    """

    decision_type: str
    reason: str
    prefill_profile: str
    encode_profile: str
    prefill: str = ""


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """Every profile's outcome (``None`` if it failed) and which profile is primary.

    ``disagg`` is set only by a disaggregating profile handler; None for every other.
    """

    profile_results: Mapping[str, ProfileRunResult | None]
    primary_profile_name: str
    disagg: DisaggDecision | None = None

    @property
    def primary(self) -> ProfileRunResult:
        result = self.profile_results.get(self.primary_profile_name)
        if result is None:
            raise LookupError(f"primary profile '{self.primary_profile_name}' has no result")
        return result


@runtime_checkable
class Filter(Plugin, Protocol):
    """Return the subset of ``endpoints`` that may serve the request, in their original order.

    Returning an empty sequence ends the profile with "no endpoints available".
    """

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    """Score each endpoint in [0, 1], 1 best, aligned with ``endpoints``.

    The profile clamps values outside [0, 1] and multiplies by the configured weight.
    """

    CATEGORY: ClassVar[ScorerCategory]

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]: ...


@runtime_checkable
class MetricsScorer(Protocol):
    """Optional fast path of a ``Scorer`` whose scores depend on the candidates' ``Metrics`` only.

    ``score_metrics(metrics)`` must return what ``score`` returns for endpoints carrying
    those readings, in the same order, whatever the request and the cycle state: a pure
    function of the sequence (it may normalise over it, as the queue scorer does).  The
    profile then computes these scores, and their weighted partial sum, once per metrics
    refresh instead of once per request: it keeps them while the candidates' ``Metrics``
    objects are the same (or equal), and calls ``score_metrics`` again when any changed.
    ``score`` must still work; it is used when a scorer is run on its own.
    """

    def score_metrics(self, metrics: Sequence[Metrics]) -> Sequence[float]: ...


@runtime_checkable
class AccumulatingScorer(Protocol):
    """Optional fast path of a request-dependent ``Scorer``: add its weighted scores into the totals.

    ``add_weighted_scores`` returns ``[t + s * weight for t, s in zip(totals, scores)]``, or
    ``[s * weight for s in scores]`` when ``totals`` is None, where ``scores`` is what
    ``score`` returns (clamped to [0, 1] by the scorer itself), computed with exactly these
    float operations so the totals are bit-identical to the per-scorer path.  It saves the
    intermediate list and its pass: one pass over the endpoints per scorer.
    """

    def add_weighted_scores(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        totals: Sequence[float] | None,
        weight: float,
    ) -> list[float]: ...


@runtime_checkable
class Picker(Plugin, Protocol):
    """Choose the target endpoints from weighted totals aligned with ``endpoints``."""

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult: ...


class SchedulerProfileView(Protocol):
    """What a profile handler may know about a profile."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class ProfileHandler(Plugin, Protocol):
    """Decides which profiles run (possibly over several rounds) and which result is primary."""

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        """Names of the profiles to run next; empty ends the cycle."""
        ...

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult: ...
