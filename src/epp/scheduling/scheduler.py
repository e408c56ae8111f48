"""The scheduler: a profile handler drives profiles of filters, weighted scorers and one picker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import isnan
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.errors import EppError
from epp.metrics.series import SCHEDULER_ATTEMPTS_TOTAL, SCHEDULER_E2E_DURATION
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import (
    PROFILE_TRACES,
    Filter,
    Picker,
    ProfileHandler,
    ProfileRunResult,
    ProfileTrace,
    SchedulingResult,
    Scorer,
)
from epp.scheduling.fused import FusedPlan
from epp.scheduling.score_cache import MetricsScoreCache
from epp.scheduling.weighting import WeightedScorer, clamped, combine, timer

log = structlog.get_logger(__name__)

NO_ENDPOINTS: Final = "no endpoints available for the given request"
MAX_ROUNDS: Final = 100  # a handler that never returns an empty pick is stopped here
_ATTEMPT_CACHE_MAX: Final = 4096


class SchedulingError(Exception):
    """Scheduling produced no target.  The message is GIE's text; the director answers 429."""


class SchedulerProfile:
    """One named pipeline: filters in order, then weighted scorers, then the picker.

    Weights are raw multipliers (not normalised), as in GIE.  Scores outside [0, 1] are
    clamped (NaN reads as 0), except for scorers that promise never to produce such values
    (``BoundedScorer``: the built-ins whose formula guarantees it); the check costs three
    C-speed passes per scorer.  Metric children are resolved here, once, so a run costs one
    ``perf_counter`` pair and one ``observe`` per plugin.

    The metrics-only scorers' scores come from the profile's ``MetricsScoreCache``
    (score_cache.py), computed as samples arrive rather than per request; only
    request-dependent scorers (prefix, LoRA, load) run per request.
    """

    __slots__ = (
        "_cache",
        "_filters",
        "_no_cached_scores",
        "_picker",
        "_scorers",
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
        self._filters = tuple((f.typed_name.name, f.filter, timer("Filter", f)) for f in self.filters)
        self._scorers = tuple(WeightedScorer(s, w) for s, w in self.scorers)
        self._picker = (picker.pick, timer("Picker", picker))
        uses_metrics = any(s.score_metrics is not None for s in self._scorers)
        self._cache = MetricsScoreCache(name, self._scorers) if uses_metrics else None
        self._no_cached_scores: tuple[None, ...] = (None,) * len(self._scorers)

    def __repr__(self) -> str:
        return f"<SchedulerProfile {self.name!r}>"

    @property
    def cache(self) -> MetricsScoreCache | None:
        """The metrics-only scores kept between requests; None when every scorer is request-dependent."""
        return self._cache

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> ProfileRunResult:
        """Filter, score and pick; raises ``SchedulingError`` when the filters leave nothing.

        An explained request (``request.explain``) takes the same loop and also keeps every
        filter's survivors and every scorer's weighted score (``contributions``), appends a
        ``ProfileTrace`` to the cycle state's ``PROFILE_TRACES`` (a failed run's too) and gets
        ``scored`` in its result.  Its totals are the plain run's floats: the contributions
        are summed left to right in scorer order, ``s*w`` times 1.0 being ``s*w``, where the
        plain run uses the cache's partial sum of the leading scorers.  A plain run only
        tests ``contributions is None``: it allocates nothing for explaining.
        """
        contributions: list[Sequence[float]] | None = None
        survivors: list[tuple[str, tuple[Endpoint, ...]]] | None = None
        if request.explain:
            contributions, survivors = [], []
            if state.get(PROFILE_TRACES) is None:
                state.put(PROFILE_TRACES, [])
        eps = endpoints
        for name, run_filter, hist in self._filters:
            t0 = perf_counter()
            eps = run_filter(state, request, eps)
            hist.observe(perf_counter() - t0)
            if survivors is not None:
                survivors.append((name, tuple(eps)))
            if not eps:
                break
        if not eps:
            if survivors is not None:
                self._trace(state, endpoints, survivors, error=NO_ENDPOINTS)
            raise SchedulingError(NO_ENDPOINTS)

        n = len(eps)
        scorers = self._scorers
        lead = 0  # the leading scorers whose weighted sum the cache keeps (plain runs use it)
        partial: list[float] | None = None  # the running totals; the cached list is never modified
        fresh = False  # whether ``partial`` is a list made for this run (else None or the cache's)
        cached: Sequence[Sequence[float] | None] = self._no_cached_scores
        cache = self._cache
        if cache is not None:
            cache.refresh(eps, n)
            cached = cache.scores
            if contributions is None:
                lead = cache.leading
                partial = cache.partial
        lists: list[Sequence[float]] = []
        weights: list[float] = []
        for i in range(lead, len(scorers)):
            sc = scorers[i]
            scores = cached[i]
            if scores is None:
                add = sc.add_weighted
                if lists and add is not None and contributions is None:  # the totals it adds to
                    partial = combine(lists, weights, n, partial)
                    lists, weights = [], []
                t0 = perf_counter()
                if add is None:
                    scores = sc.score(state, request, eps)
                elif contributions is None:  # one pass: weighted scores straight into the totals
                    scores = partial = add(state, request, eps, partial, sc.weight)
                    fresh = True
                else:  # its contract: exactly score() * weight, the contribution alone
                    scores = add(state, request, eps, None, sc.weight)
                sc.hist.observe(perf_counter() - t0)
                if len(scores) != n:
                    raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
                if add is not None:
                    if contributions is not None:
                        contributions.append(scores)
                        lists.append(scores)
                        weights.append(1.0)
                    continue
                if not sc.bounded:
                    scores = clamped(scores)
            w = sc.weight
            if contributions is not None:  # weighted here and summed with weight 1.0: the same floats
                scores = [x * w for x in scores]
                contributions.append(scores)
                w = 1.0
            lists.append(scores)
            weights.append(w)
        if fresh and not lists and partial is not None:
            totals = partial
        else:
            totals = combine(lists, weights, n, partial)

        kept = () if contributions is None else tuple(totals)  # before the picker may reorder its list
        pick, hist = self._picker
        t0 = perf_counter()
        result = pick(state, request, eps, totals)
        hist.observe(perf_counter() - t0)
        if contributions is None:
            return result
        self._trace(state, endpoints, survivors or [], tuple(eps), tuple(contributions), kept, result)
        return ProfileRunResult(result.target_endpoints, scored=tuple(zip(eps, kept, strict=True)))

    def _trace(
        self,
        state: CycleState,
        candidates: Sequence[Endpoint],
        survivors: list[tuple[str, tuple[Endpoint, ...]]],
        scored: tuple[Endpoint, ...] = (),
        contributions: tuple[Sequence[float], ...] = (),
        totals: tuple[float, ...] = (),
        result: ProfileRunResult | None = None,
        error: str = "",
    ) -> None:
        """Append an explained run's ``ProfileTrace`` to the cycle state's ``PROFILE_TRACES``."""
        traces = state.get(PROFILE_TRACES)
        if traces is None:  # the run put it; a plugin took it out
            traces = []
            state.put(PROFILE_TRACES, traces)
        traces.append(
            ProfileTrace(
                self.name,
                tuple(candidates),
                tuple(survivors),
                tuple((s.typed_name.name, w) for s, w in self.scorers),
                scored,
                contributions,
                totals,
                self.picker.typed_name.name if result is not None else "",
                tuple(result.target_endpoints) if result is not None else (),
                error,
            )
        )


class Scheduler:
    """Runs the profile handler's rounds and returns its verdict (GIE ``Scheduler.Schedule``).

    A profile that fails (filters left nothing, or a plugin raised) stores ``None`` as its
    result; the handler decides whether that is fatal.  Every call records
    ``scheduler_e2e_duration_seconds`` and one ``scheduler_attempts_total``.

    The common shape (one profile under ``single-profile-handler``, no filters) is compiled
    into a ``FusedPlan`` (fused.py) here, once; requests that are not explained run it instead
    of the handler's rounds.  ``fused=False`` keeps the general path for every request (the
    differential tests compare the two).
    """

    __slots__ = ("_attempts", "_fused", "_handler", "_pick_timer", "_process_timer", "_profiles", "handler")

    def __init__(
        self, handler: ProfileHandler, profiles: Sequence[SchedulerProfile], *, fused: bool = True
    ) -> None:
        by_name: dict[str, SchedulerProfile] = {}
        for p in profiles:
            if p.name in by_name:
                raise ValueError(f"duplicate scheduling profile name '{p.name}'")
            by_name[p.name] = p
        self.handler = handler
        self._profiles: Mapping[str, SchedulerProfile] = by_name
        self._pick_timer = timer("ProfilePicker", handler)
        self._process_timer = timer("ProcessProfilesResults", handler)
        self._attempts: dict[tuple[str, str, str, str, int], Any] = {}
        self._fused = FusedPlan.compile(handler, profiles, self._process_timer) if fused else None

    @property
    def fused(self) -> FusedPlan | None:
        """The compiled plan plain requests run, or None: every request takes the general path."""
        return self._fused

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
            if self._fused is not None and not request.explain:
                result = self._schedule_fused(self._fused, state, request, candidates, t_start)
            else:
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
        return self._process(state, request, results)

    def _schedule_fused(
        self,
        plan: FusedPlan,
        state: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        t_start: float,
    ) -> SchedulingResult:
        """``_schedule`` for the compiled shape: the one profile's plan, then the handler's verdict.

        The single-profile handler's two rounds (run the profile; then nothing is left to run)
        were decided at build time; each is observed as the ``ProfilePicker`` duration it costs
        now, the time from the call to here, so the metric counts what GIE's does.  Its verdict
        on a result is that result, primary (the plan's, kept per picked endpoint); a failed
        run is ``None`` for the handler to judge, with its error text, as on the general path.
        """
        decided = perf_counter() - t_start
        pick = self._pick_timer.observe
        pick(decided)
        name = plan.name
        result: SchedulingResult | None
        try:
            result = plan.schedule(state, request, candidates)  # the handler's verdict included
        except SchedulingError as e:
            log.debug("scheduler_profile_failed", profile=name, error=str(e))
            result = None
        except Exception:
            log.exception("scheduler_profile_failed", profile=name)
            result = None
        pick(decided)
        if result is None:  # the handler's verdict and GIE's error text
            return self._process(state, request, {name: None})
        return result

    def _process(
        self, state: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        """The handler's verdict on the profiles' results, its failures as ``SchedulingError``."""
        handler = self.handler
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
