"""The scheduler: a profile handler drives profiles of filters, weighted scorers and one picker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress
from math import isnan
from operator import is_not
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint, Metrics
from epp.errors import EppError
from epp.metrics.series import PLUGIN_DURATION, SCHEDULER_ATTEMPTS_TOTAL, SCHEDULER_E2E_DURATION
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import (
    PROFILE_TRACES,
    AccumulatingScorer,
    Filter,
    IncrementalMetricsScorer,
    MetricsScorer,
    Picker,
    ProfileHandler,
    ProfileRunResult,
    ProfileTrace,
    SchedulingResult,
    Scorer,
)

log = structlog.get_logger(__name__)

NO_ENDPOINTS: Final = "no endpoints available for the given request"
MAX_ROUNDS: Final = 100  # a handler that never returns an empty pick is stopped here
_ATTEMPT_CACHE_MAX: Final = 4096
# Recompute only the changed endpoints while at most 1 in this many changed; past that, one
# full pass is cheaper than the per-position updates.
_INCREMENTAL_SHARE: Final = 3
# A pass over every endpoint on a sample's arrival costs about as much as applying one sample
# per this many endpoints (measured: ~3 µs per sample, ~0.1 µs per endpoint and pass).
_SCAN_SAMPLES: Final = 30


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

    __slots__ = (
        "add_weighted",
        "bounded",
        "hist",
        "inc",
        "score",
        "score_metrics",
        "weight",
    )

    def __init__(self, scorer: Scorer, weight: float) -> None:
        self.score = scorer.score
        self.hist = _timer("Scorer", scorer)
        self.bounded = bool(getattr(scorer, "BOUNDED", False))
        self.score_metrics = scorer.score_metrics if isinstance(scorer, MetricsScorer) else None
        self.inc = scorer if isinstance(scorer, IncrementalMetricsScorer) else None
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
    the candidates carry the same readings.  When a few readings changed and every such
    scorer is an ``IncrementalMetricsScorer``, only those endpoints are rescored (and all
    of them for a scorer whose min or max moved).  Better still, once the same candidates
    come twice the profile listens to them (``Endpoint.add_metrics_listener``) and applies
    each sample as it is stored (``metrics_stored``), off the request path, while samples
    are few per request; a request on that very tuple then reads no metrics at all.  Only
    request-dependent scorers (prefix, LoRA, load) run per request.  The totals are
    bit-identical to scoring every scorer per request (tests/scheduling/test_differential.py
    holds the reference).
    """

    __slots__ = (
        "__weakref__",  # endpoints hold their metrics listeners weakly
        "_cand",
        "_eager",
        "_filters",
        "_incremental",
        "_lead",
        "_lead_weights",
        "_live",
        "_metrics_hists",
        "_metrics_idx",
        "_picker",
        "_pos",
        "_scorers",
        "_seen",
        "_since",
        "_snap_metrics",
        "_snap_partial",
        "_snap_scores",
        "_snap_summaries",
        "_snap_values",
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
        self._metrics_idx = tuple(i for i, s in enumerate(self._scorers) if s.score_metrics is not None)
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
        # For the incremental scorers: each one's per-endpoint values and their summary.
        self._snap_values: list[list[Any] | None] = [None] * len(self._scorers)
        self._snap_summaries: list[Any] = [None] * len(self._scorers)
        self._incremental = all(s.inc is not None for s in self._scorers if s.score_metrics is not None)
        # Eager upkeep (``metrics_stored``): the candidates the snapshot's positions are for.
        self._cand: tuple[Endpoint, ...] | None = None
        self._pos: dict[Endpoint, int] = {}
        self._seen: tuple[Endpoint, ...] | None = None  # the last candidates, not yet adopted
        self._live = False  # the snapshot holds the current reading of every endpoint of ``_cand``
        self._eager = True  # apply samples at arrival in this interval between requests
        self._since = 0  # samples heard since the last request

    def __repr__(self) -> str:
        return f"<SchedulerProfile {self.name!r}>"

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> ProfileRunResult:
        """Filter, score and pick; raises ``SchedulingError`` when the filters leave nothing."""
        if request.explain:  # the only cost of explaining to a request that does not ask
            return self._run_explained(state, request, endpoints)
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
        return result

    def _run_explained(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> ProfileRunResult:
        """``run`` keeping every filter's survivors and every scorer's weighted score.

        A separate path so that ``run`` allocates nothing for requests that do not ask.  The
        totals are the fast path's floats: contributions are added left to right in scorer
        order, and metrics-only scores come from the same snapshot.  The trace is appended
        to the cycle state's ``PROFILE_TRACES`` (a failed run's too) and the result carries
        ``scored``.
        """
        traces = state.get(PROFILE_TRACES)
        if traces is None:
            traces = []
            state.put(PROFILE_TRACES, traces)
        eps = endpoints
        survivors: list[tuple[str, tuple[Endpoint, ...]]] = []
        for f, (run_filter, hist) in zip(self.filters, self._filters, strict=True):
            t0 = perf_counter()
            eps = run_filter(state, request, eps)
            hist.observe(perf_counter() - t0)
            survivors.append((f.typed_name.name, tuple(eps)))
            if not eps:
                break
        names = tuple((s.typed_name.name, w) for s, w in self.scorers)
        if not eps:
            traces.append(
                ProfileTrace(self.name, tuple(endpoints), tuple(survivors), names, error=NO_ENDPOINTS)
            )
            raise SchedulingError(NO_ENDPOINTS)
        n = len(eps)
        if self._uses_metrics:
            self._refresh(eps, n)
        contributions: list[Sequence[float]] = []
        for sc, snap in zip(self._scorers, self._snap_scores, strict=True):
            scores = snap
            if scores is None:
                t0 = perf_counter()
                if sc.add_weighted is not None:  # its contract: exactly score() * weight
                    contributions.append(sc.add_weighted(state, request, eps, None, sc.weight))
                    sc.hist.observe(perf_counter() - t0)
                    continue
                scores = sc.score(state, request, eps)
                sc.hist.observe(perf_counter() - t0)
                if not sc.bounded:
                    scores = _clamped(scores)
            w = sc.weight
            contributions.append([x * w for x in scores])
        for c in contributions:
            if len(c) != n:
                raise ValueError(f"scorer returned {len(c)} scores for {n} endpoints")
        totals = _combine(contributions, (1.0,) * len(contributions), n, None)  # x * 1.0 is x
        kept = tuple(totals)  # before the picker, which may reorder its list
        pick, hist = self._picker
        t0 = perf_counter()
        result = pick(state, request, eps, totals)
        hist.observe(perf_counter() - t0)
        traces.append(
            ProfileTrace(
                self.name,
                tuple(endpoints),
                tuple(survivors),
                names,
                tuple(eps),
                tuple(contributions),
                kept,
                self.picker.typed_name.name,
                tuple(result.target_endpoints),
            )
        )
        return ProfileRunResult(result.target_endpoints, scored=tuple(zip(eps, kept, strict=True)))

    def _refresh(self, eps: Sequence[Endpoint], n: int) -> None:
        """Bring the metrics-only scores up to the candidates' current readings.

        A ``Metrics`` object is one stored sample (the data layer replaces, never mutates),
        so identity is the reading's version.  The candidates the snapshot is live for
        (``_track``) get each new sample applied at arrival (``metrics_stored``), so when
        the request's candidates are that very tuple (the datastore's, in the common case)
        nothing is read at all.  Otherwise the endpoints whose object differs from the
        snapshot's at the same position are the ones to recompute.  None: reuse everything.
        A few, and every metrics scorer incremental: recompute those (``_update``).  Many,
        or a different candidate list: recompute all (``_rebuild``).
        """
        t0 = perf_counter()
        since = self._since
        self._since = 0
        # Samples of the interval that just ended decide the next: few per request are worth
        # applying at arrival; more, and one request-time recomputation costs less.
        self._eager = since * _INCREMENTAL_SHARE <= n
        if self._live and eps is self._cand:
            self._observe_metrics(t0)
            return
        metrics = [ep.metrics for ep in eps]  # a comprehension beats map(attrgetter) on slots
        snap = self._snap_metrics
        if snap is not None and len(snap) == n:
            # Same objects (or equal readings): reuse everything.  The identity test of the first
            # reading saves a Metrics.__eq__ call when every endpoint was rescraped.
            if metrics[0] is snap[0] and metrics == snap:
                self._observe_metrics(t0)
                if not self._live or (type(eps) is tuple and eps is not self._cand):
                    self._track(eps)
                return
            # Both ends changed: most likely a new candidate list or every endpoint rescraped,
            # so skip the scan for the few changed ones and recompute everything.
            if self._incremental and (metrics[0] is snap[0] or metrics[-1] is snap[-1]):
                changed = list(compress(range(n), map(is_not, metrics, snap)))
                if len(changed) * _INCREMENTAL_SHARE <= n:
                    self._update(changed, [metrics[i] for i in changed])
                    self._observe_metrics(t0)
                    self._track(eps)
                    return
        self._rebuild(metrics, n)
        self._track(eps)

    def _observe_metrics(self, t0: float) -> None:
        hists = self._metrics_hists  # one clock read for all: the scorers' shares are alike
        share = (perf_counter() - t0) / len(hists)
        for hist in hists:
            hist.observe(share)

    # --- eager upkeep: samples applied as they arrive ------------------------------------------
    def _track(self, eps: Sequence[Endpoint]) -> None:
        """The snapshot now holds ``eps``'s readings: is it live for the tracked candidates?

        Candidates are adopted (listened to, positions indexed) once the same ones come
        twice in a row, so a filter that hands each request a different subset costs a
        tuple comparison, not a round of listener registrations.
        """
        if not self._incremental:
            return
        cand = eps if type(eps) is tuple else tuple(eps)
        if cand is self._cand or cand == self._cand:
            if type(eps) is tuple:  # the same endpoints in a new tuple: the shortcut follows it
                self._cand = cand
            self._live = True
            return
        self._live = False  # the snapshot's positions are ``cand``'s, not ``_cand``'s
        if cand != self._seen:
            self._seen = cand
            return
        pos = {ep: i for i, ep in enumerate(cand)}
        if len(pos) != len(cand):  # an endpoint twice: a sample's position is ambiguous
            self._seen = None
            return
        if self._cand is not None:
            for ep in self._cand:
                if ep not in pos:
                    ep.remove_metrics_listener(self)
        for ep in cand:
            ep.add_metrics_listener(self)
        self._cand, self._pos, self._seen, self._live, self._eager = cand, pos, None, True, True

    def metrics_stored(self, endpoint: Endpoint) -> None:
        """A tracked endpoint stored a new reading: rescore it now, off the request path.

        Only while the snapshot is live and the interval has seen few samples (at most one
        in ``_INCREMENTAL_SHARE`` of the candidates, as at request time); past that the
        snapshot stops being live and the next request compares and recomputes once.  A
        failure (a scorer raising) drops the snapshot, so the next request rebuilds it and
        raises, if it must, on the request path.
        """
        self._since += 1
        if not self._live:
            return
        pos = self._pos.get(endpoint)
        if pos is None:  # listened to for candidates since replaced
            return
        if not self._eager or self._since * _INCREMENTAL_SHARE > len(self._pos):
            self._live = False
            return
        m = endpoint.metrics
        if m is self._snap_metrics[pos]:  # type: ignore[index]  # live: there is a snapshot
            return
        try:
            self._update_one(pos, m)
        except Exception:
            log.exception("scheduler_metrics_update_failed", profile=self.name, endpoint=endpoint.name)
            self._live = False
            self._snap_metrics = None

    def _rebuild(self, metrics: list[Metrics], n: int) -> None:
        """Score every candidate with every metrics scorer and sum the leading ones.

        The incremental scorers' values and summaries are not kept here: ``_update`` derives
        them from the snapshot when it first needs them, so a fleet rescraped before every
        request pays nothing for the incremental path.
        """
        scores_by_scorer: list[Sequence[float] | None] = []
        for sc in self._scorers:
            if sc.score_metrics is None:
                scores_by_scorer.append(None)
                continue
            t0 = perf_counter()
            scores = sc.score_metrics(metrics)
            if len(scores) != n:
                raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
            scores_by_scorer.append(scores if sc.bounded else _clamped(scores))
            sc.hist.observe(perf_counter() - t0)
        lead = self._lead
        partial = None
        if lead:
            partial = _combine(scores_by_scorer[:lead], self._lead_weights, n, None)  # type: ignore[arg-type]
        self._snap_scores = scores_by_scorer
        self._snap_values = [None] * len(scores_by_scorer)
        self._snap_summaries = [None] * len(scores_by_scorer)
        self._snap_partial = partial
        self._snap_metrics = metrics

    def _start_updates(self, j: int, inc: IncrementalMetricsScorer, snap_metrics: list[Metrics]) -> list[Any]:
        """Scorer ``j``'s values and summary of the snapshot's (still old) readings, and its
        scores as a private list to update in place: what the first update after a rebuild needs."""
        values = self._snap_values[j] = inc.metric_values(snap_metrics)
        self._snap_summaries[j] = inc.summarize(values)
        self._snap_scores[j] = list(self._snap_scores[j])  # type: ignore[arg-type]
        return values

    def _update_one(self, pos: int, m: Metrics) -> None:
        """``_update([pos], [m])`` without its lists and zips: the per-sample path, ~3x cheaper.

        A pass over every endpoint (the min or max moved) is charged to the interval's
        sample count, so samples that keep moving the bounds of a large fleet soon leave the
        rest of the interval to one batched update at the next request.
        """
        snap_metrics: list[Metrics] = self._snap_metrics  # type: ignore[assignment]  # live: not None
        scorers = self._scorers
        snap_scores = self._snap_scores
        snap_values = self._snap_values
        summaries = self._snap_summaries
        lead = self._lead
        whole = touched = False
        scans = 0  # passes over every endpoint (a summary rescanned, every score recomputed)
        one = (m,)
        for j in self._metrics_idx:
            sc = scorers[j]
            inc: IncrementalMetricsScorer = sc.inc  # type: ignore[assignment]  # _incremental: all are
            values = snap_values[j]
            if values is None:  # the first update since a rebuild
                values = self._start_updates(j, inc, snap_metrics)
            new = inc.metric_values(one)
            old = values[pos]
            if new[0] == old:
                continue
            values[pos] = new[0]
            summary = moved = summaries[j]
            if summary is not None:
                moved = inc.update_summary(summary, (old,), new)
                if moved is None:
                    moved = inc.summarize(values)
                    scans += 1
            if moved == summary:
                x = inc.scores_for(new, summary)[0]
                if not sc.bounded and not 0.0 <= x <= 1.0:  # _clamped, for one value
                    x = 0.0 if not x > 0.0 else 1.0
                snap_scores[j][pos] = x  # type: ignore[index]
            else:
                rescored = inc.scores_for(values, moved)
                snap_scores[j] = rescored if sc.bounded else _clamped(rescored)
                summaries[j] = moved
                whole = whole or j < lead
                scans += 1
            touched = touched or j < lead
        if touched:
            if whole:
                lists: list[Sequence[float]] = snap_scores[:lead]  # type: ignore[assignment]
                self._snap_partial = _combine(lists, self._lead_weights, len(snap_metrics), None)
            else:
                weights = self._lead_weights
                t = snap_scores[0][pos] * weights[0]  # type: ignore[index]
                for k in range(1, lead):
                    t = t + snap_scores[k][pos] * weights[k]  # type: ignore[index]  # _combine's order
                self._snap_partial[pos] = t  # type: ignore[index]
        snap_metrics[pos] = m
        if scans:  # charged to the interval's budget: a pass costs ~1/_SCAN_SAMPLES as much per endpoint
            self._since += scans * len(snap_metrics) // _SCAN_SAMPLES

    def _update(self, changed: list[int], sub: list[Metrics]) -> None:
        """Take the readings ``sub`` at positions ``changed``; recompute those positions only,
        every position of a scorer whose summary moved.

        A scorer whose values at ``changed`` are the old ones has nothing to do.  Otherwise
        its summary, unless None (no fleet term), is brought up to date (``update_summary``,
        or ``summarize`` over every value when that cannot tell: a changed endpoint may have
        been the min or the max);
        unchanged, only the changed endpoints are rescored, moved, every endpoint is.  The
        partial sum is recomputed at the changed positions with ``_combine``'s float
        operations (bit-identical), or whole when a leading scorer rescored everyone.  The
        snapshot's lists are private (``run`` hands out copies), so they are updated in place.
        """
        snap_metrics: list[Metrics] = self._snap_metrics  # type: ignore[assignment]  # callers: not None
        scorers = self._scorers
        snap_scores = self._snap_scores
        snap_values = self._snap_values
        summaries = self._snap_summaries
        lead = self._lead
        whole = False  # whether a leading scorer rescored every endpoint
        touched = False  # whether any leading scorer's scores changed
        for j in self._metrics_idx:
            sc = scorers[j]
            inc: IncrementalMetricsScorer = sc.inc  # type: ignore[assignment]  # _incremental: all are
            values = snap_values[j]
            if values is None:  # the first update since a rebuild
                values = self._start_updates(j, inc, snap_metrics)
            new = inc.metric_values(sub)
            old = [values[i] for i in changed]
            if new == old:
                continue
            for i, v in zip(changed, new, strict=True):
                values[i] = v
            summary = moved = summaries[j]
            if summary is not None:  # None: no fleet term, nothing to update
                moved = inc.update_summary(summary, old, new)
                if moved is None:
                    moved = inc.summarize(values)
            if moved == summary:
                sub_scores: Sequence[float] = inc.scores_for(new, summary)
                if not sc.bounded:
                    sub_scores = _clamped(sub_scores)
                kept: list[float] = snap_scores[j]  # type: ignore[assignment]
                for i, x in zip(changed, sub_scores, strict=True):
                    kept[i] = x
            else:
                rescored = inc.scores_for(values, moved)
                snap_scores[j] = rescored if sc.bounded else _clamped(rescored)  # owned: a new list
                summaries[j] = moved
                whole = whole or j < lead
            touched = touched or j < lead
        if touched:
            lists: list[Sequence[float]] = snap_scores[:lead]  # type: ignore[assignment]
            weights = self._lead_weights
            if whole:
                self._snap_partial = _combine(lists, weights, len(snap_metrics), None)
            else:
                partial: list[float] = self._snap_partial  # type: ignore[assignment]
                first, w0 = lists[0], weights[0]
                rest = tuple(zip(lists[1:], weights[1:], strict=True))
                for i in changed:
                    t = first[i] * w0
                    for scores_k, w in rest:
                        t = t + scores_k[i] * w  # _combine's order: ((x*wa + y*wb) + z*wc)
                    partial[i] = t
        for i, m in zip(changed, sub, strict=True):
            snap_metrics[i] = m


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
