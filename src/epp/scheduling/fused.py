"""The fused plan: the common scheduler shape compiled once, run as one straight pass per request.

When it applies (decided once, when the ``Scheduler`` is built, never per request): the
``single-profile-handler`` with its one ``SchedulerProfile``, no filters, any weighted scorers
and any picker.  That is GIE's default config, llm-d's prefix-aware configs and the
prefix-heavy one.  Anything else takes the general path: several profiles or another handler
(P/D, data-parallel, header-chosen profiles, whose handler decides rounds per request), a
profile with filters, a traced twin (``TracedProfile``, for sampled requests), and every
explained request (``request.explain``: the general path keeps the per-scorer contributions
and traces that ``/debug`` and the explain header show).

Why: the general path decides per request what is known at build time.  The handler is asked
twice which profiles to run and builds a results dict; the profile tests for an explanation,
loops over an empty filter list, and for each scorer tests whether its scores are cached,
whether it accumulates, whether its scores need clamping and where its list goes.  Here that
is decided once: the scorers after the metrics score cache's leading ones are compiled into
``_Group``s (the cached or per-request score lists ``combine`` adds, then at most one
accumulating scorer that adds its weighted scores into the running totals), and
``max-score-picker`` picking one endpoint is inlined (the usual ``maxNumOfEndpoints``), its
result and the handler's verdict on it kept per endpoint (``FusedPlan.schedule``).

The floats are those of the general path, bit for bit: the same plugins are called with the
same arguments in the same order, the same ``combine`` adds the same lists in the same order,
and the same picker RNG breaks ties the same way (tests/scheduling/test_fused.py runs both on
generated traffic and compares picks and totals; tests/scheduling/test_vectors.py holds the
recorded outcomes).  Per-plugin durations are observed as on the general path: one
observation per scorer run, per picker run and per metrics-cache refresh.

The scoring in C (``epp.scheduling.kernel``): when every scorer after the cache's leading ones
is a cached metrics scorer, ``prefix-cache-scorer`` with ``matchLengthWeight`` 0,
``token-load-scorer`` or ``prefill-load-scorer`` (decided here, once), ``totals`` hands the
cache's lists, the cycle state's attribute dicts, the prefill backlog and the prompt's tokens to
one C call that computes the same floats (the same operations in the same order, no fused
multiply-add: tests/scheduling/test_kernel.py).  Any other scorer, ``EPP_PURE_PYTHON=1`` or an
extension not built: the Python path below, unchanged; an input the kernel cannot compute
exactly (an int above 2**53, say) makes that one request take it too.  The metrics compromise:
one C pass cannot time its scorers apart, so each scorer the kernel ran per request (the cached
ones are only read, as on the Python path) gets one observation of the kernel's duration divided
by the number of such scorers: the same count of observations and the same sum, not each
scorer's own share.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any, Final

import structlog

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, PRECISE_PREFIX_MATCH, PREFIX_MATCH
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, prompt_tokens
from epp.scheduling import kernel
from epp.scheduling.api import ProfileHandler, ProfileRunResult, SchedulingResult
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.scheduling.weighting import WeightedScorer, clamped, combine, timer

log = structlog.get_logger(__name__)

VERDICTS_MAX: Final = 4096  # endpoints whose verdict is kept (more than any pool: then it starts again)


class _Group:
    """Score lists that ``combine`` adds to the running totals, then at most one accumulating
    scorer (``add``) that adds its weighted scores into them.

    ``lists`` holds, per list, the cache slot it is read from (an int) or the scorer that
    scores it per request (a ``WeightedScorer``), in scorer order.
    """

    __slots__ = ("add", "lists", "weights")

    def __init__(self) -> None:
        self.lists: list[int | WeightedScorer] = []
        self.weights: list[float] = []
        self.add: WeightedScorer | None = None


class FusedPlan:
    """One profile's run, compiled (``compile``), for a scheduler whose shape allows it."""

    __slots__ = (
        "_cache",
        "_groups",
        "_kernel",
        "_kernel_hists",
        "_kernel_loads",
        "_kernel_prefill",
        "_max_score",
        "_pick",
        "_pick_hist",
        "_process_hist",
        "_verdicts",
        "name",
        "tail",
    )

    def __init__(self, profile: Any, process_hist: Any) -> None:
        self.name: str = profile.name
        self._cache = profile.cache
        lead = self._cache.leading if self._cache is not None else 0
        groups: list[_Group] = [_Group()]
        for j, sc in enumerate(profile._scorers[lead:], start=lead):
            group = groups[-1]
            if sc.score_metrics is not None:  # cached: read from the score cache's slot j
                group.lists.append(j)
                group.weights.append(sc.weight)
            elif sc.add_weighted is not None:
                group.add = sc
                groups.append(_Group())
            else:
                group.lists.append(sc)
                group.weights.append(sc.weight)
        # The last group's lists are added with the picker's totals (``tail``); an empty one
        # leaves the last accumulating scorer's list as the totals, as on the general path.
        last = groups.pop()
        self.tail = last if last.lists else None
        self._groups = tuple(groups)
        self._pick, self._pick_hist = profile._picker
        self._process_hist = process_hist  # the handler's ``ProcessProfilesResults`` duration
        self._verdicts: dict[Endpoint, SchedulingResult] = {}
        # ``max-score-picker``, inlined for one endpoint (read per request, as its RNG: tests
        # replace ``rng`` with a seeded one after building).
        self._max_score: MaxScorePicker | None = (
            profile.picker if type(profile.picker) is MaxScorePicker else None
        )
        self._kernel: Any = None  # the C kernel's plan (epp.scheduling.kernel), when it covers the profile
        self._kernel_hists: tuple[Any, ...] = ()  # the histograms of the scorers it runs per request
        self._kernel_loads = False  # whether it reads INFLIGHT_LOAD (a token-load-scorer)
        self._kernel_prefill: PrefillLoadScorer | None = None  # whose backlog it reads
        if kernel.Plan is not None:
            self._compile_kernel(profile, lead)
        _log_scoring(self.name, self._kernel is not None)

    def _compile_kernel(self, profile: Any, lead: int) -> None:
        """Hand the scoring to the C kernel when every scorer after the cache's leading ones is
        one it computes (cached, prefix with ``matchLengthWeight`` 0, token load, prefill load)."""
        ops: list[tuple[int, int, float, float]] = []
        hists: list[Any] = []
        for j, sc in enumerate(profile._scorers[lead:], start=lead):
            plugin = profile.scorers[j][0]
            if sc.score_metrics is not None:
                ops.append((kernel.CACHED, j, sc.weight, 0.0))
                continue
            kind = type(plugin)
            if kind is PrefixCacheScorer and plugin.match_length_weight <= 0.0:
                ops.append((kernel.PREFIX, 0, sc.weight, 0.0))
            elif kind is TokenLoadScorer:
                ops.append((kernel.TOKEN, 0, sc.weight, plugin.queue_threshold_tokens))
                self._kernel_loads = True
            elif kind is PrefillLoadScorer and self._kernel_prefill in (None, plugin):
                ops.append((kernel.PREFILL, 0, sc.weight, 0.0))
                self._kernel_prefill = plugin
            else:  # a scorer the kernel does not compute: the Python path, always
                self._kernel_loads, self._kernel_prefill = False, None
                return
            hists.append(sc.hist)
        self._kernel = kernel.Plan(ops)
        self._kernel_hists = tuple(hists)

    @property
    def implementation(self) -> str:
        """Which computes the totals: "c" (the kernel) or "python"."""
        return "python" if self._kernel is None else "c"

    @staticmethod
    def compile(
        handler: ProfileHandler, profiles: Sequence[Any], process_hist: Any = None
    ) -> FusedPlan | None:
        """The plan for this handler and these profiles, or None when the general path must run."""
        from epp.scheduling.scheduler import SchedulerProfile  # the scheduler imports this module

        if type(handler) is not SingleProfileHandler or len(profiles) != 1:
            return None
        profile = profiles[0]
        if type(profile) is not SchedulerProfile or profile.filters:
            return None
        return FusedPlan(
            profile, process_hist if process_hist is not None else timer("ProcessProfilesResults", handler)
        )

    def run(self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]) -> ProfileRunResult:
        """Score and pick, as ``SchedulerProfile.run`` does for a request that is not explained."""
        return self.schedule(state, request, eps).profile_results[self.name]  # type: ignore[return-value]

    def schedule(
        self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]
    ) -> SchedulingResult:
        """``run`` and the single-profile handler's verdict on it (its one result, primary).

        The inlined ``max-score-picker`` picks one endpoint, and the verdict for an endpoint is
        always the same two frozen objects, so they are made once per endpoint and kept
        (``_verdicts``), not per request (two frozen dataclasses cost ~12k instructions a
        request).  The handler's verdict is observed as the lookup it now is; the picker's time
        ends where it begins (one clock read between them).
        """
        totals = self.totals(state, request, eps)
        picker = self._max_score
        if picker is not None and picker.max_num_of_endpoints == 1:
            t0 = perf_counter()
            best = max(totals)
            if totals.count(best) == 1:  # the usual case: a unique best
                ep = eps[totals.index(best)]
            else:
                ties = [i for i, s in enumerate(totals) if s == best]
                ep = eps[ties[picker.rng.randrange(len(ties))]]
            t1 = perf_counter()
            self._pick_hist.observe(t1 - t0)
            verdict = self._verdicts.get(ep)
            if verdict is None:
                verdict = self._verdict(ProfileRunResult((ep,)), ep)
            self._process_hist.observe(perf_counter() - t1)
            return verdict
        t0 = perf_counter()
        run = self._pick(state, request, eps, totals)
        t1 = perf_counter()
        self._pick_hist.observe(t1 - t0)
        verdict = SchedulingResult(profile_results={self.name: run}, primary_profile_name=self.name)
        self._process_hist.observe(perf_counter() - t1)
        return verdict

    def _verdict(self, run: ProfileRunResult, ep: Endpoint) -> SchedulingResult:
        """The verdict for a pick of ``ep`` alone, kept for the next request that picks it.

        Endpoints that left the pool stay until the table is full, then it starts again: it
        holds at most ``VERDICTS_MAX`` endpoints, and every value is immutable (the result and
        its ``profile_results`` are never changed by the scheduler or a plugin).
        """
        verdicts = self._verdicts
        if len(verdicts) >= VERDICTS_MAX:
            verdicts.clear()
        verdict = verdicts[ep] = SchedulingResult(
            profile_results={self.name: run}, primary_profile_name=self.name
        )
        return verdict

    def totals(self, state: CycleState, request: InferenceRequest, eps: Sequence[Endpoint]) -> list[float]:
        """Every candidate's weighted total, the floats the general path hands its picker.

        Raises ``SchedulingError`` with GIE's text when there are no candidates, as a profile
        without filters does.
        """
        n = len(eps)
        if not n:
            from epp.scheduling.scheduler import NO_ENDPOINTS, SchedulingError  # it imports this module

            raise SchedulingError(NO_ENDPOINTS)
        cache = self._cache
        partial: Any = None
        cached: Sequence[Any] = ()
        if cache is not None:
            cache.refresh(eps, n)
            partial = cache.partial
            cached = cache.scores
        plan = self._kernel
        if plan is not None:
            # The scorers' inputs, read as they read them (``state.attributes`` called, not bound:
            # a bound method is an allocation); the kernel takes the precise matches over the
            # approximate ones when there are any, as ``prefill-load-scorer`` does.
            t0 = perf_counter()
            prefill = self._kernel_prefill
            precise = backlog = None
            prompt = 0
            if prefill is not None:
                precise = state.attributes(PRECISE_PREFIX_MATCH)
                backlog = prefill._backlog
                prompt = request.prompt_token_count
                if prompt < 0:
                    prompt = prompt_tokens(request)
            totals: list[float] | None = plan.totals(
                eps,
                partial,
                cached,
                state.attributes(PREFIX_MATCH),
                state.attributes(INFLIGHT_LOAD) if self._kernel_loads else None,
                precise,
                backlog,
                prompt,
            )
            if totals is not None:
                hists = self._kernel_hists
                if hists:  # one observation per scorer run, each its share of the kernel's time
                    share = (perf_counter() - t0) / len(hists)
                    for hist in hists:
                        hist.observe(share)
                return totals
            # an input the kernel does not compute exactly (an int above 2**53, ...): Python's path
        for g in self._groups:
            if g.lists:
                partial = combine(_lists(g, cached, state, request, eps, n), g.weights, n, partial)
            add: WeightedScorer = g.add  # type: ignore[assignment]  # every group but the tail has one
            t0 = perf_counter()
            partial = add.add_weighted(state, request, eps, partial, add.weight)  # type: ignore[misc]
            add.hist.observe(perf_counter() - t0)
            if len(partial) != n:
                raise ValueError(f"scorer returned {len(partial)} scores for {n} endpoints")
        tail = self.tail
        if tail is not None:
            return combine(_lists(tail, cached, state, request, eps, n), tail.weights, n, partial)
        if self._groups:  # the last accumulating scorer's list, made for this request
            return partial  # type: ignore[no-any-return]
        return combine((), (), n, partial)  # a copy of the cached partial sum (or zeros)


def _lists(
    g: _Group,
    cached: Sequence[Any],
    state: CycleState,
    request: InferenceRequest,
    eps: Sequence[Endpoint],
    n: int,
) -> list[Sequence[float]]:
    """The group's score lists: the cache's, or scored now (timed, length-checked, clamped)."""
    out: list[Sequence[float]] = []
    for item in g.lists:
        if type(item) is int:
            out.append(cached[item])
            continue
        sc: WeightedScorer = item  # type: ignore[assignment]
        t0 = perf_counter()
        scores = sc.score(state, request, eps)
        sc.hist.observe(perf_counter() - t0)
        if len(scores) != n:
            raise ValueError(f"scorer returned {len(scores)} scores for {n} endpoints")
        out.append(scores if sc.bounded else clamped(scores))
    return out


def _log_scoring(profile: str, in_c: bool) -> None:
    """Say, when a plan is compiled (at start and on a reload), which computes its scoring: a
    kernel that was not built is worth a warning (``EPP_PURE_PYTHON`` is a choice)."""
    if kernel.NATIVE is None:
        log.warning("scheduling_kernel", profile=profile, implementation="python", reason=kernel.REASON)
    elif in_c:
        log.info("scheduling_kernel", profile=profile, implementation="c")
    else:
        log.info(
            "scheduling_kernel",
            profile=profile,
            implementation="python",
            reason=kernel.REASON or "a scorer of the profile the kernel does not compute",
        )
