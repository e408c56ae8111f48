"""The scheduler: a profile handler drives profiles of filters, weighted scorers and one picker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import isnan
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint, Metrics
from epp.errors import EppError
from epp.metrics.series import PLUGIN_DURATION, SCHEDULER_ATTEMPTS_TOTAL, SCHEDULER_E2E_DURATION
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import (
    AccumulatingScorer,
    Filter,
    MetricsScorer,
    Picker,
    ProfileHandler,
    ProfileRunResult,
    SchedulingResult,
    Scorer,
)

log = structlog.get_logger(__name__)

NO_ENDPOINTS: Final = "no endpoints available for the given request"
MAX_ROUNDS: Final = 100  # a handler that never returns an empty pick is stopped here
_ATTEMPT_CACHE_MAX: Final = 4096


class SchedulingError(Exception):
    """Scheduling produced no target.  The message is GIE's text; the director answers 429."""


def _timer(extension_point: str, plugin: Any) -> Any:
    """The histogram child for one plugin at one extension point, resolved once."""
    tn = plugin.typed_name
    return PLUGIN_DURATION.labels(extension_point, tn.type, tn.name)


def _clamped(scores: Sequence[float]) -> Sequence[float]:
    """``scores`` with every value clamped to [0, 1] and NaN read as 0.

    The common case (already in range, no NaN) is detected with C-speed min/max/sum and
    returns the input untouched, so the per-element loop carries no clamp.
    """
    s = sum(scores)
    if min(scores) >= 0.0 and max(scores) <= 1.0 and s == s:
        return scores
    return [0.0 if not v > 0.0 else (1.0 if v > 1.0 else v) for v in scores]


def _combine(
    lists: Sequence[Sequence[float]], weights: Sequence[float], n: int, partial: Sequence[float] | None
) -> list[float]:
    """``partial[i] + sum_k lists[k][i] * weights[k]`` for every i, added in scorer order.

    Without ``partial`` the sum starts from the first weighted score.  One fused pass for the
    usual one to three lists instead of one pass per scorer.  Floats are added left to right
    exactly as ``((x*wa + y*wb) + z*wc)``, so a cached partial sum of the leading scorers
    gives bit-identical totals.
    """
    k = len(lists)
    if partial is None:
        if k == 0:
            return [0.0] * n
        if k == 1:
            (a,), (wa,) = lists, weights
            return [x * wa for x in a]
        if k == 2:
            (a, b), (wa, wb) = lists, weights
            return [x * wa + y * wb for x, y in zip(a, b, strict=True)]
        if k == 3:
            (a, b, c), (wa, wb, wc) = lists, weights
            return [x * wa + y * wb + z * wc for x, y, z in zip(a, b, c, strict=True)]
        if k == 4:
            (a, b, c, d), (wa, wb, wc, wd) = lists, weights
            return [x * wa + y * wb + z * wc + u * wd for x, y, z, u in zip(a, b, c, d, strict=True)]
        totals = [x * weights[0] for x in lists[0]]
        lists, weights = lists[1:], weights[1:]
    else:
        if k == 0:
            return list(partial)  # a copy: the picker must not see (or touch) the cached list
        if k == 1:
            (a,), (wa,) = lists, weights
            return [p + x * wa for p, x in zip(partial, a, strict=True)]
        if k == 2:
            (a, b), (wa, wb) = lists, weights
            return [p + x * wa + y * wb for p, x, y in zip(partial, a, b, strict=True)]
        totals = list(partial)
    for scores, w in zip(lists, weights, strict=True):
        totals = [t + x * w for t, x in zip(totals, scores, strict=True)]
    return totals


class _Scorer:
    """One weighted scorer of a profile, its histogram child and its optional metrics-only path."""

    __slots__ = ("add_weighted", "bounded", "hist", "score", "score_metrics", "weight")

    def __init__(self, scorer: Scorer, weight: float) -> None:
        self.score = scorer.score
        self.hist = _timer("Scorer", scorer)
        self.bounded = bool(getattr(scorer, "BOUNDED", False))
        self.score_metrics = scorer.score_metrics if isinstance(scorer, MetricsScorer) else None
        self.add_weighted = scorer.add_weighted_scores if isinstance(scorer, AccumulatingScorer) else None
        self.weight = weight


class SchedulerProfile:
    """One named pipeline: filters in order, then weighted scorers, then the picker.

    Weights are raw multipliers (not normalised), as in GIE.  Scores outside [0, 1] are
    clamped (NaN reads as 0), except for scorers whose class sets ``BOUNDED = True`` to
    promise they never produce such values (the built-ins whose formula guarantees it);
    the check costs three C-speed passes per scorer.  Metric children are resolved here,
    once, so a run costs one ``perf_counter`` pair and one ``observe`` per plugin.

    Scorers that implement ``MetricsScorer`` (scores from the candidates' ``Metrics``
    alone: queue, running requests, KV cache) are computed once per metrics refresh: the
    profile keeps their clamped scores, and the weighted partial sum of the leading ones,
    with the list of ``Metrics`` objects they were computed from, and reuses them while
    the candidates carry the same readings.  Only request-dependent scorers (prefix,
    LoRA, load) run per request.  The totals are bit-identical to scoring every scorer
    per request (tests/scheduling/test_differential.py holds the reference).
    """

    __slots__ = (
        "_filters",
        "_lead",
        "_lead_weights",
        "_metrics_hists",
        "_picker",
        "_scorers",
        "_snap_metrics",
        "_snap_partial",
        "_snap_scores",
        "_uses_metrics",
        "filters",
        "name",
        "picker",
        "scorers",
    )

    def __init__(
        self,
        name: str,
        *,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
    ) -> None:
        for scorer, weight in scorers:
            if isnan(weight):  # the config builder defaults a missing weight to 1.0
                raise ValueError(f"failed to register scorer '{scorer.typed_name}' without a weight")
        self.name = name
        self.filters: tuple[Filter, ...] = tuple(filters)
        self.scorers: tuple[tuple[Scorer, float], ...] = tuple((s, float(w)) for s, w in scorers)
        self.picker = picker
        self._filters = tuple((f.filter, _timer("Filter", f)) for f in self.filters)
        self._scorers = tuple(_Scorer(s, w) for s, w in self.scorers)
        self._metrics_hists = tuple(s.hist for s in self._scorers if s.score_metrics is not None)
        self._uses_metrics = bool(self._metrics_hists)
        lead = 0  # how many leading scorers are metrics-only: their partial sum is cached
        while lead < len(self._scorers) and self._scorers[lead].score_metrics is not None:
            lead += 1
        self._lead = lead
        self._lead_weights = tuple(s.weight for s in self._scorers[:lead])
        self._picker = (picker.pick, _timer("Picker", picker))
        # The metrics snapshot: readings, per-scorer scores (None: request-dependent), partial sum.
        self._snap_metrics: list[Metrics] | None = None
        self._snap_scores: list[Sequence[float] | None] = [None] * len(self._scorers)
        self._snap_partial: list[float] | None = None

    def __repr__(self) -> str:
        return f"<SchedulerProfile {self.name!r}>"

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> ProfileRunResult:
        """Filter, score and pick; raises ``SchedulingError`` when the filters leave nothing."""
        eps = endpoints
        for run_filter, hist in self._filters:
            t0 = perf_counter()
            eps = run_filter(state, request, eps)
            hist.observe(perf_counter() - t0)
            if not eps:
                break
        if not eps:
            raise SchedulingError(NO_ENDPOINTS)

        n = len(eps)
        scorers = self._scorers
        lead = 0
        partial: list[float] | None = None  # the running totals; the cached list is never modified
        fresh = False  # whether ``partial`` is a list made for this run (else None or the cache's)
        if self._uses_metrics:
            self._refresh(eps, n)
            lead = self._lead
            partial = self._snap_partial
        snap = self._snap_scores
        lists: list[Sequence[float]] = []
        weights: list[float] = []
        for i in range(lead, len(scorers)):
            sc = scorers[i]
            scores = snap[i]
            if scores is None:
                if sc.add_weighted is not None:  # one pass: scores straight into the totals
                    if lists:
                        partial = _combine(lists, weights, n, partial)
                        lists, weights = [], []
                    t0 = perf_counter()
                    partial = sc.add_weighted(state, request, eps, partial, sc.weight)
                    fresh = True
                    sc.hist.observe(perf_counter() - t0)
                    if len(partial) != n:
                        raise ValueError(f"scorer returned {len(partial)} scores for {n} endpoints")
                    continue
                t0 = perf_counter()
                scores = sc.score(state, request, eps)
                sc.hist.observe(perf_counter() - t0)
                if len(scores) != n:
                    raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
                if not sc.bounded:
                    scores = _clamped(scores)
            lists.append(scores)
            weights.append(sc.weight)
        if fresh and not lists and partial is not None:
            totals = partial
        else:
            totals = _combine(lists, weights, n, partial)

        pick, hist = self._picker
        t0 = perf_counter()
        result = pick(state, request, eps, totals)
        hist.observe(perf_counter() - t0)
        if request.explain:
            return ProfileRunResult(result.target_endpoints, scored=tuple(zip(eps, totals, strict=True)))
        return result

    def _refresh(self, eps: Sequence[Endpoint], n: int) -> None:
        """Bring the metrics-only scores up to the candidates' current readings."""
        t0 = perf_counter()
        metrics = [ep.metrics for ep in eps]  # a comprehension beats map(attrgetter) on slots
        snap = self._snap_metrics
        # Same objects (or equal readings) as last time: reuse everything.  The identity test of
        # the first reading saves a Metrics.__eq__ call on the usual miss (a new scrape).
        if snap is not None and len(snap) == n and metrics[0] is snap[0] and metrics == snap:
            hists = self._metrics_hists
            share = (perf_counter() - t0) / len(hists)
            for hist in hists:
                hist.observe(share)
            return
        scores_by_scorer: list[Sequence[float] | None] = []
        for sc in self._scorers:
            if sc.score_metrics is None:
                scores_by_scorer.append(None)
                continue
            t0 = perf_counter()
            scores = sc.score_metrics(metrics)
            sc.hist.observe(perf_counter() - t0)
            if len(scores) != n:
                raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
            scores_by_scorer.append(scores if sc.bounded else _clamped(scores))
        lead = self._lead
        partial = None
        if lead:
            partial = _combine(scores_by_scorer[:lead], self._lead_weights, n, None)  # type: ignore[arg-type]
        self._snap_scores = scores_by_scorer
        self._snap_partial = partial
        self._snap_metrics = metrics


class Scheduler:
    """Runs the profile handler's rounds and returns its verdict (GIE ``Scheduler.Schedule``).

    A profile that fails (filters left nothing, or a plugin raised) stores ``None`` as its
    result; the handler decides whether that is fatal.  Every call records
    ``scheduler_e2e_duration_seconds`` and one ``scheduler_attempts_total``.
    """

    __slots__ = ("_attempts", "_handler", "_pick_timer", "_process_timer", "_profiles", "handler")

    def __init__(self, handler: ProfileHandler, profiles: Sequence[SchedulerProfile]) -> None:
        by_name: dict[str, SchedulerProfile] = {}
        for p in profiles:
            if p.name in by_name:
                raise ValueError(f"duplicate scheduling profile name '{p.name}'")
            by_name[p.name] = p
        self.handler = handler
        self._profiles: Mapping[str, SchedulerProfile] = by_name
        self._pick_timer = _timer("ProfilePicker", handler)
        self._process_timer = _timer("ProcessProfilesResults", handler)
        self._attempts: dict[tuple[str, str, str, str, int], Any] = {}

    @property
    def profiles(self) -> Mapping[str, SchedulerProfile]:
        return self._profiles

    def schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        """Pick the target endpoints for ``request``; raises ``SchedulingError`` with GIE's text."""
        t_start = perf_counter()
        result: SchedulingResult | None = None
        try:
            result = self._schedule(state, request, candidates)
            return result
        finally:
            SCHEDULER_E2E_DURATION.observe(perf_counter() - t_start)
            self._record_attempt(request.target_model, result)

    def _schedule(
        self, state: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        handler = self.handler
        profiles = self._profiles
        results: dict[str, ProfileRunResult | None] = {}
        for _ in range(MAX_ROUNDS):
            t0 = perf_counter()
            try:
                names = handler.pick_profiles(state, request, profiles, results)
            except Exception as e:
                raise SchedulingError(str(e)) from e
            finally:
                self._pick_timer.observe(perf_counter() - t0)
            if not names:
                break
            for name in names:
                profile = profiles.get(name)
                if profile is None:
                    raise SchedulingError(f"profile handler picked unknown scheduling profile '{name}'")
                try:
                    results[name] = profile.run(state, request, candidates)
                except SchedulingError as e:
                    log.debug("scheduler_profile_failed", profile=name, error=str(e))
                    results[name] = None
                except Exception:
                    log.exception("scheduler_profile_failed", profile=name)
                    results[name] = None
        else:
            raise SchedulingError(f"profile handler did not finish within {MAX_ROUNDS} rounds")

        if not results:
            raise SchedulingError(f"failed to run any scheduler profile for request {request.request_id}")

        t0 = perf_counter()
        try:
            return handler.process_results(state, request, results)
        except (SchedulingError, EppError):  # an EppError carries its own status (P/D fail-closed: 503)
            raise
        except Exception as e:
            raise SchedulingError(str(e)) from e
        finally:
            self._process_timer.observe(perf_counter() - t0)

    def _record_attempt(self, target_model: str, result: SchedulingResult | None) -> None:
        ep: Endpoint | None = None
        if result is not None:
            primary = result.profile_results.get(result.primary_profile_name)
            if primary is not None and primary.target_endpoints:
                ep = primary.target_endpoints[0]
        if ep is None:
            status, pod, ns, port = ("success" if result is not None else "failure"), "", "", 0
        else:
            md = ep.metadata
            status, pod, ns, port = "success", md.pod_name or md.name, md.namespace, md.port
        key = (status, target_model, pod, ns, port)
        child = self._attempts.get(key)
        if child is None:
            if len(self._attempts) >= _ATTEMPT_CACHE_MAX:
                self._attempts.clear()
            child = SCHEDULER_ATTEMPTS_TOTAL.labels(status, target_model, pod, ns, str(port) if ep else "")
            self._attempts[key] = child
        child.inc()
