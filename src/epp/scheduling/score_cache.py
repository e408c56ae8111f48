"""The metrics score cache: a profile's metrics-only scores, kept from one request to the next.

Scorers that implement ``MetricsScorer`` (scores from the candidates' ``Metrics`` alone: queue,
running requests, KV cache) need computing once per metrics refresh, not once per request.  The
cache keeps their clamped scores, and the weighted partial sum of the leading ones, with the
list of ``Metrics`` objects they were computed from, and reuses them while the candidates carry
the same readings.  When a few readings changed and every such scorer is an
``IncrementalMetricsScorer``, only those endpoints are rescored (and all of them for a scorer
whose min or max moved).  Better still, once the same candidates come twice the cache listens
to them (``Endpoint.add_metrics_listener``) and applies each sample as it is stored
(``metrics_stored``), off the request path, while samples are few per request; a request on
that very tuple then reads no metrics at all.

The profile (scheduler.py) asks ``refresh`` for the request's candidates, then reads
``scores``, ``partial`` and ``leading``.  The totals it makes from them are bit-identical to
scoring every scorer per request (tests/scheduling/test_differential.py holds the reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import is_not
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint, Metrics
from epp.scheduling.api import IncrementalMetricsScorer
from epp.scheduling.weighting import WeightedScorer, clamped, combine

log = structlog.get_logger(__name__)

# Recompute only the changed endpoints while at most 1 in this many changed; past that, one
# full pass is cheaper than the per-position updates.
INCREMENTAL_SHARE: Final = 3
# A pass over every endpoint on a sample's arrival costs about as much as applying one sample
# per this many endpoints (measured: ~3 µs per sample, ~0.1 µs per endpoint and pass).
SCAN_SAMPLES: Final = 30


class MetricsScoreCache:
    """The metrics-only scores of one profile's scorers for the candidates it last saw.

    ``scores[j]`` is scorer j's clamped scores (None: j is request-dependent, scored per
    request); ``partial`` the weighted sum of the first ``leading`` scorers, all metrics-only
    (None when there are none).  The lists are the cache's own: the profile reads them and
    never hands them out unchanged.
    """

    __slots__ = (
        "__weakref__",  # endpoints hold their metrics listeners weakly
        "_apply_on_arrival",
        "_hists",
        "_incremental",
        "_last_candidates",
        "_leading_weights",
        "_live",
        "_metrics",
        "_metrics_idx",
        "_position",
        "_profile",
        "_samples_heard",
        "_scorers",
        "_summaries",
        "_tracked",
        "_values",
        "leading",
        "partial",
        "scores",
    )

    def __init__(self, profile: str, scorers: Sequence[WeightedScorer]) -> None:
        self._profile = profile  # for the log line of a failed update
        self._scorers = tuple(scorers)
        self._metrics_idx = tuple(j for j, s in enumerate(self._scorers) if s.score_metrics is not None)
        self._hists = tuple(self._scorers[j].hist for j in self._metrics_idx)
        leading = 0
        while leading < len(self._scorers) and self._scorers[leading].score_metrics is not None:
            leading += 1
        self.leading = leading
        self._leading_weights = tuple(s.weight for s in self._scorers[:leading])
        self._incremental = all(self._scorers[j].inc is not None for j in self._metrics_idx)
        # The snapshot: readings, per-scorer scores, partial sum.
        self._metrics: list[Metrics] | None = None
        self.scores: list[Sequence[float] | None] = [None] * len(self._scorers)
        self.partial: list[float] | None = None
        # For the incremental scorers: each one's per-endpoint values and their summary.
        self._values: list[list[Any] | None] = [None] * len(self._scorers)
        self._summaries: list[Any] = [None] * len(self._scorers)
        # Samples applied at arrival: the candidates the snapshot's positions are for.
        self._tracked: tuple[Endpoint, ...] | None = None
        self._position: dict[Endpoint, int] = {}
        self._last_candidates: tuple[Endpoint, ...] | None = None  # seen once, not yet tracked
        self._live = False  # the snapshot holds the current reading of every tracked endpoint
        self._apply_on_arrival = True  # in this interval between requests
        self._samples_heard = 0  # since the last request, plus the cost of full passes

    @property
    def live(self) -> bool:
        """Whether samples of the tracked candidates are applied as they arrive."""
        return self._live

    @property
    def tracked(self) -> tuple[Endpoint, ...] | None:
        """The candidates listened to (and the tuple a request may hand over to read nothing)."""
        return self._tracked

    def refresh(self, eps: Sequence[Endpoint], n: int) -> None:
        """Bring the scores up to the candidates' current readings.

        A ``Metrics`` object is one stored sample (the data layer replaces, never mutates), so
        identity is the reading's version.  When the candidates are the tracked tuple (the
        datastore's, in the common case) and the snapshot is live, nothing is read at all.
        Otherwise the endpoints whose object differs from the snapshot's at the same position
        are the ones to recompute.  None: reuse everything.  A few, and every metrics scorer
        incremental: recompute those (``_apply``).  Many, or a different candidate list:
        recompute all (``_rebuild``).
        """
        t0 = perf_counter()
        heard = self._samples_heard
        self._samples_heard = 0
        # Samples of the interval that just ended decide the next: few per request are worth
        # applying at arrival; more, and one request-time recomputation costs less.
        self._apply_on_arrival = heard * INCREMENTAL_SHARE <= n
        if self._live and eps is self._tracked:  # ``_observe``, inlined: the usual request's path
            hists = self._hists
            share = (perf_counter() - t0) / len(hists)
            for hist in hists:
                hist.observe(share)
            return
        metrics = [ep.metrics for ep in eps]  # a comprehension beats map(attrgetter) on slots
        snap = self._metrics
        if snap is not None and len(snap) == n:
            # Same objects (or equal readings): reuse everything.  The identity test of the first
            # reading saves a Metrics.__eq__ call when every endpoint was rescraped.
            if metrics[0] is snap[0] and metrics == snap:
                self._observe(t0)
                if not self._live or (type(eps) is tuple and eps is not self._tracked):
                    self._track(eps)
                return
            # Both ends changed: most likely a new candidate list or every endpoint rescraped,
            # so skip the scan for the few changed ones and recompute everything.
            if self._incremental and (metrics[0] is snap[0] or metrics[-1] is snap[-1]):
                changed = list(compress(range(n), map(is_not, metrics, snap)))
                if len(changed) * INCREMENTAL_SHARE <= n:
                    self._apply(changed, [metrics[i] for i in changed])
                    self._observe(t0)
                    self._track(eps)
                    return
        self._rebuild(metrics, n)
        self._track(eps)

    def _observe(self, t0: float) -> None:
        hists = self._hists  # one clock read for all: the scorers' shares are alike
        share = (perf_counter() - t0) / len(hists)
        for hist in hists:
            hist.observe(share)

    # --- samples applied as they arrive ---------------------------------------------------------
    def _track(self, eps: Sequence[Endpoint]) -> None:
        """The snapshot now holds ``eps``'s readings: is it live for the tracked candidates?

        Candidates are tracked (listened to, positions indexed) once the same ones come twice
        in a row, so a filter that hands each request a different subset costs a tuple
        comparison, not a round of listener registrations.
        """
        if not self._incremental:
            return
        cand = eps if type(eps) is tuple else tuple(eps)
        if cand is self._tracked or cand == self._tracked:
            if type(eps) is tuple:  # the same endpoints in a new tuple: the shortcut follows it
                self._tracked = cand
            self._live = True
            return
        self._live = False  # the snapshot's positions are ``cand``'s, not the tracked ones'
        if cand != self._last_candidates:
            self._last_candidates = cand
            return
        position = {ep: i for i, ep in enumerate(cand)}
        if len(position) != len(cand):  # an endpoint twice: a sample's position is ambiguous
            self._last_candidates = None
            return
        if self._tracked is not None:
            for ep in self._tracked:
                if ep not in position:
                    ep.remove_metrics_listener(self)
        for ep in cand:
            ep.add_metrics_listener(self)
        self._tracked, self._position, self._last_candidates = cand, position, None
        self._live = self._apply_on_arrival = True

    def metrics_stored(self, endpoint: Endpoint) -> None:
        """A tracked endpoint stored a new reading: rescore it now, off the request path.

        Only while the snapshot is live and the interval has seen few samples (at most one in
        ``INCREMENTAL_SHARE`` of the candidates, as at request time); past that the snapshot
        stops being live and the next request compares and recomputes once.  A pass over every
        endpoint (the min or max moved) is charged to the interval's count, so samples that
        keep moving the bounds of a large fleet soon leave the rest of the interval to one
        batched update at the next request.  A failure (a scorer raising) drops the snapshot,
        so the next request rebuilds it and raises, if it must, on the request path.
        """
        self._samples_heard += 1
        if not self._live:
            return
        pos = self._position.get(endpoint)
        if pos is None:  # listened to for candidates since replaced
            return
        if not self._apply_on_arrival or self._samples_heard * INCREMENTAL_SHARE > len(self._position):
            self._live = False
            return
        m = endpoint.metrics
        snap: list[Metrics] = self._metrics  # type: ignore[assignment]  # live: there is a snapshot
        if m is snap[pos]:
            return
        try:
            scans = self._apply((pos,), (m,))
        except Exception:
            log.exception("scheduler_metrics_update_failed", profile=self._profile, endpoint=endpoint.name)
            self._live = False
            self._metrics = None
            return
        if scans:  # a pass costs ~1/SCAN_SAMPLES as much per endpoint as a sample
            self._samples_heard += scans * len(snap) // SCAN_SAMPLES

    # --- recomputation ------------------------------------------------------------------------
    def _rebuild(self, metrics: list[Metrics], n: int) -> None:
        """Score every candidate with every metrics scorer and sum the leading ones.

        The incremental scorers' values and summaries are not kept here: ``_apply`` derives
        them from the snapshot when it first needs them, so a fleet rescraped before every
        request pays nothing for the incremental path.
        """
        scores: list[Sequence[float] | None] = []
        for sc in self._scorers:
            if sc.score_metrics is None:
                scores.append(None)
                continue
            t0 = perf_counter()
            got = sc.score_metrics(metrics)
            if len(got) != n:
                raise ValueError(f"scorer returned {len(got)} scores for {n} endpoints")
            scores.append(got if sc.bounded else clamped(got))
            sc.hist.observe(perf_counter() - t0)
        leading = self.leading
        self.partial = combine(scores[:leading], self._leading_weights, n, None) if leading else None  # type: ignore[arg-type]
        self.scores = scores
        self._values = [None] * len(scores)
        self._summaries = [None] * len(scores)
        self._metrics = metrics

    def _start_updates(self, j: int, inc: IncrementalMetricsScorer, snap: list[Metrics]) -> list[Any]:
        """Scorer ``j``'s values and summary of the snapshot's (still old) readings, and its
        scores as a private list to update in place: what the first update after a rebuild needs."""
        values = self._values[j] = inc.metric_values(snap)
        self._summaries[j] = inc.summarize(values)
        self.scores[j] = list(self.scores[j])  # type: ignore[arg-type]
        return values

    def _apply(self, changed: Sequence[int], readings: Sequence[Metrics]) -> int:
        """Take ``readings`` at positions ``changed``; recompute those positions only, every
        position of a scorer whose summary moved.  Returns the passes made over every endpoint.

        A scorer whose values at ``changed`` are the old ones has nothing to do.  Otherwise its
        summary, unless None (no fleet term), is brought up to date (``update_summary``, or
        ``summarize`` over every value when that cannot tell: a changed endpoint may have been
        the min or the max); unchanged, only the changed endpoints are rescored, moved, every
        endpoint is.  The partial sum is recomputed at the changed positions with ``combine``'s
        float operations (bit-identical), or whole when a leading scorer rescored everyone.  The
        lists are the cache's own, so they are updated in place.

        One sample at arrival and a request's batch take this same path; for one position
        (``single``) the values are read and written as scalars, not through loops, which
        makes a sample's arrival about twice as cheap.
        """
        snap: list[Metrics] = self._metrics  # type: ignore[assignment]  # callers: not None
        scorers = self._scorers
        scores = self.scores
        all_values = self._values
        summaries = self._summaries
        leading = self.leading
        single = len(changed) == 1
        pos = changed[0]
        whole = False  # whether a leading scorer rescored every endpoint
        touched = False  # whether any leading scorer's scores changed
        scans = 0  # passes over every endpoint (a summary rescanned, every score recomputed)
        for j in self._metrics_idx:
            sc = scorers[j]
            inc: IncrementalMetricsScorer = sc.inc  # type: ignore[assignment]  # _incremental: all are
            values = all_values[j]
            if values is None:  # the first update since a rebuild
                values = self._start_updates(j, inc, snap)
            new = inc.metric_values(readings)
            old: Sequence[Any]
            if single:
                was, now = values[pos], new[0]
                if now == was:
                    continue
                values[pos] = now
                old = (was,)
            else:
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
                    scans += 1
            if moved == summary:
                kept: list[float] = scores[j]  # type: ignore[assignment]
                rescored = inc.scores_for(new, summary)
                if single:  # ``clamped`` for one value: the same float
                    x = rescored[0]
                    kept[pos] = x if sc.bounded or 0.0 <= x <= 1.0 else (0.0 if not x > 0.0 else 1.0)
                else:
                    for i, x in zip(changed, rescored if sc.bounded else clamped(rescored), strict=True):
                        kept[i] = x
            else:
                rescored = inc.scores_for(values, moved)
                scores[j] = rescored if sc.bounded else clamped(rescored)  # owned: a new list
                summaries[j] = moved
                whole = whole or j < leading
                scans += 1
            touched = touched or j < leading
        if touched:
            weights = self._leading_weights
            if whole:
                self.partial = combine(scores[:leading], weights, len(snap), None)  # type: ignore[arg-type]
            else:
                partial: list[float] = self.partial  # type: ignore[assignment]
                for i in changed:
                    t = scores[0][i] * weights[0]  # type: ignore[index]
                    for k in range(1, leading):
                        t = t + scores[k][i] * weights[k]  # type: ignore[index]  # combine's order
                    partial[i] = t
        if single:
            snap[pos] = readings[0]
        else:
            for i, m in zip(changed, readings, strict=True):
                snap[i] = m
        return scans
