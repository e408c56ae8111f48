"""The scheduler: a profile handler drives profiles of filters, weighted scorers and one picker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import isnan
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.metrics.series import PLUGIN_DURATION, SCHEDULER_ATTEMPTS_TOTAL, SCHEDULER_E2E_DURATION
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import (
    Filter,
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


def _combine(lists: list[Sequence[float]], weights: Sequence[float], n: int) -> list[float]:
    """``sum_k lists[k][i] * weights[k]`` for every i, added in scorer order from 0.

    One fused pass for the usual one to four scorers instead of one pass per scorer.
    """
    k = len(lists)
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
    for scores, w in zip(lists[1:], weights[1:], strict=True):
        totals = [t + x * w for t, x in zip(totals, scores, strict=True)]
    return totals


class SchedulerProfile:
    """One named pipeline: filters in order, then weighted scorers, then the picker.

    Weights are raw multipliers (not normalised), as in GIE.  Scores outside [0, 1] are
    clamped (NaN reads as 0), except for scorers whose class sets ``BOUNDED = True`` to
    promise they never produce such values (the built-ins whose formula guarantees it);
    the check costs three C-speed passes per scorer.  Metric children are resolved here,
    once, so a run costs one ``perf_counter`` pair and one ``observe`` per plugin.
    """

    __slots__ = ("_filters", "_picker", "_scorers", "_weights", "filters", "name", "picker", "scorers")

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
        self._scorers = tuple(
            (s.score, _timer("Scorer", s), bool(getattr(s, "BOUNDED", False))) for s, _ in self.scorers
        )
        self._weights = tuple(w for _, w in self.scorers)
        self._picker = (picker.pick, _timer("Picker", picker))

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
        lists: list[Sequence[float]] = []
        for run_scorer, hist, bounded in self._scorers:
            t0 = perf_counter()
            scores = run_scorer(state, request, eps)
            hist.observe(perf_counter() - t0)
            if len(scores) != n:
                raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
            lists.append(scores if bounded else _clamped(scores))
        totals = _combine(lists, self._weights, n)

        pick, hist = self._picker
        t0 = perf_counter()
        result = pick(state, request, eps, totals)
        hist.observe(perf_counter() - t0)
        return result


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
        except SchedulingError:
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
