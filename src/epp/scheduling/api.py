"""Contracts of the scheduling plugins and the nouns of a scheduling result.

Filters, scorers and pickers are plain ``def``: the scheduling hot path never awaits.
Scores travel as sequences aligned with the endpoint sequence they were computed for,
which avoids a dict per scorer per request.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint, Metrics
from epp.plugin.base import Plugin
from epp.plugin.keys import StateKey
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
class ProfileTrace:
    """How one profile run reached its pick; made only for an explained request (``request.explain``).

    ``scored`` are the endpoints that passed every filter, in candidate order;
    ``contributions[k][i]`` is scorer k's weighted score for ``scored[i]`` (its clamped score
    times its weight), and ``totals[i]`` their sum in scorer order: the very float the picker
    saw.  A run whose filters left nothing has ``error`` set and no scores.
    """

    profile: str
    candidates: tuple[Endpoint, ...]
    filters: tuple[tuple[str, tuple[Endpoint, ...]], ...]  # (filter name, its survivors), in order
    scorers: tuple[tuple[str, float], ...] = ()  # (scorer name, weight), in order
    scored: tuple[Endpoint, ...] = ()
    contributions: tuple[Sequence[float], ...] = ()
    totals: Sequence[float] = ()
    picker: str = ""
    picked: tuple[Endpoint, ...] = ()
    error: str = ""


# Every profile run of an explained request appends its trace here, failed runs too (several
# profiles, or several rounds of one, per request: P/D runs a decode and a prefill profile).
PROFILE_TRACES: StateKey[list[ProfileTrace]] = StateKey("epp.explain.profile-traces")


@dataclass(frozen=True, slots=True)
class DisaggDecision:
    """What a disaggregating profile handler decided for one request (P/D, E/P/D).

    ``decision_type`` is llm-d's metric label (``decode-only``, ``prefill-decode``,
    ``encode-decode``, ``encode-prefill-decode``); ``reason`` says why prefill was or was
    not used (``disaggregated``, ``decider_declined``, ``no_prefill_decider``,
    ``no_prefill_profile``); ``prefill`` is the prefill target's ``ip:port`` or "".
    Response-side plugins read ``prefill_profile`` to know which result is the prefill leg.
    ``declined_profile`` names the profile that served a declined request whole in place of
    the decode pick (the handler's ``declinedProfile``, this project's extension), else "".
    """

    decision_type: str
    reason: str
    prefill_profile: str
    encode_profile: str
    prefill: str = ""
    declined_profile: str = ""


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

    The profile clamps values outside [0, 1] (NaN reads as 0) and multiplies by the configured
    weight; a scorer that promises never to need the clamp says so with ``BoundedScorer``.
    """

    CATEGORY: ClassVar[ScorerCategory]

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]: ...


@runtime_checkable
class BoundedScorer(Protocol):
    """Optional promise of a ``Scorer``: with ``BOUNDED = True`` every score it returns is in [0, 1].

    The profile then skips its range check (three C-speed passes per scorer and request) for
    ``score``, ``score_metrics`` and ``scores_for`` alike; a value outside [0, 1] from such a
    scorer reaches the picker as is.  Declare it only where the formula guarantees it (the
    min-max scorers, the prefix and LoRA scorers); a scorer without the attribute, or with
    ``BOUNDED = False``, is clamped.
    """

    BOUNDED: ClassVar[bool]


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
class IncrementalMetricsScorer(MetricsScorer, Protocol):
    """Optional finer form of a ``MetricsScorer``: one reading per endpoint plus a fleet summary.

    ``score_metrics(ms)`` must equal ``scores_for(vs, summarize(vs))`` with
    ``vs = metric_values(ms)``, where ``metric_values`` reads each endpoint's value from its
    own ``Metrics`` only, and ``scores_for`` scores each value from that value and the
    summary only (so it may be called on any subset).  The summary is what normalisation
    needs: ``(min, max)`` for the queue scorer, ``None`` for a scorer with no fleet term
    (then always None: ``update_summary`` is not called).

    It lets the profile recompute only the endpoints whose ``Metrics`` object changed since
    the last request, or each endpoint as its sample is stored (the data layer stores each
    sample as a new object, so the object is the reading's version): it refreshes those
    values, updates the summary (from the old and new values when ``update_summary`` can,
    else ``summarize`` over all of them: a changed endpoint may have been the min or the
    max), and rescores only the changed endpoints when the summary is unchanged, every
    endpoint when it moved.
    """

    def metric_values(self, metrics: Sequence[Metrics]) -> list[Any]: ...

    def summarize(self, values: Sequence[Any]) -> Hashable: ...

    def scores_for(self, values: Sequence[Any], summary: Any) -> list[float]:
        """A new list (the profile keeps and updates it)."""
        ...

    def update_summary(self, summary: Any, old: Sequence[Any], new: Sequence[Any]) -> Hashable:
        """The summary after some values changed from ``old`` to ``new``, or None when it cannot
        tell without seeing every value (the profile then calls ``summarize``)."""
        ...


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


def only_result(results: Mapping[str, ProfileRunResult | None], handler: str) -> tuple[str, ProfileRunResult]:
    """The one profile's result, for handlers that run exactly one profile (GIE's error texts).

    ``handler`` names the handler in the error, e.g. ``single profile handler``.
    """
    if len(results) != 1:
        raise ValueError(
            f"{handler} is intended to be used with a single profile, failed to process multiple profiles"
        )
    ((name, result),) = results.items()
    if result is None:
        raise ValueError(f"failed to run scheduler profile '{name}'")
    return name, result


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
