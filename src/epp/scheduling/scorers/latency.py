"""``latency-scorer``: prefer endpoints by predicted SLO headroom (GIE's formula, gie-inventory §4.5)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION, LatencyPredictionInfo, prefix_matches
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class LatencyScorerParams(PluginParams):
    """GIE's names and defaults."""

    ttft_weight: float = 0.8
    tpot_weight: float = 0.2
    headroom_selection_strategy: Literal["least", "most"] = "least"
    composite_kv_weight: float = Field(1.0, alias="compositeKVWeight")  # not to_camel's ...Kv...
    composite_queue_weight: float = 1.0
    composite_prefix_weight: float = 1.0
    # ours (not in GIE): > 0 routes requests without an SLO around the endpoints kept for SLO traffic
    # (docs/latency-prediction.md#best-effort-routing-ours)
    best_effort_ttft_ms: float = Field(0.0, alias="bestEffortTTFTMs", ge=0.0)
    best_effort_placement: Literal["reserve", "pack"] = "reserve"
    slo_reserve_endpoints: int = Field(1, ge=0)


# A reserve is kept while a request with an SLO was scored this recently: a fleet that serves no
# SLO traffic routes best-effort requests exactly as GIE does (to the fastest endpoint).
SLO_RECENT_S: Final = 10.0


def _has_prediction(info: LatencyPredictionInfo | None) -> bool:
    return info is not None and (info.ttft_valid or info.tpot_valid)


def _slo_free(info: LatencyPredictionInfo | None) -> bool:
    """The request carries no SLO: the producer's headroom is ``SLO - prediction``, so with an
    SLO of 0 it is exactly ``-prediction`` on every valid dimension."""
    if info is None or not (info.ttft_valid or info.tpot_valid):
        return False
    return (not info.ttft_valid or info.ttft_headroom + info.ttft == 0.0) and (
        not info.tpot_valid or info.tpot_headroom + info.tpot == 0.0
    )


def _headrooms(info: LatencyPredictionInfo | None) -> tuple[float, float]:
    """(TTFT, TPOT) headroom; an invalid or missing dimension counts as 0 (no information)."""
    if info is None:
        return 0.0, 0.0
    return (info.ttft_headroom if info.ttft_valid else 0.0, info.tpot_headroom if info.tpot_valid else 0.0)


class LatencyScorer(PluginBase):
    """Score by predicted headroom.  Type ``latency-scorer``, category Distribution.

    Reads ``LatencyPredictionInfo`` (ms; headroom = SLO - prediction).  With no valid
    prediction on any endpoint, a composite of load signals: weights
    (``compositeKVWeight``, ``compositeQueueWeight``, ``compositePrefixWeight``) normalised
    (a non-positive sum means KV only); ``relQueue = (maxQ - q) / maxQ`` (1 when maxQ = 0),
    ``kvFree = 1 - kv``, ``prefix = match / total``; ``score = round(100·composite) / 100``.
    With predictions: endpoints whose two headrooms are ≥ 0 (or that have no prediction)
    are positive and only they are scored, the rest 0.  With no positive endpoint: the idle
    ones (``dispatchedRequestCount == 0``) score 1 and the rest 0; with none idle, only the
    best non-empty bucket of [TPOT-only negative, TTFT-only negative, both negative] is
    scored, with strategy ``least``.  Bucket scoring: a, b = normalised
    (``ttftWeight``, ``tpotWeight``); per dimension, min/max of ``|headroom|`` over the
    bucket; a dimension with zero range gets weight 0 (when the other has a range) and the
    normalised value 0.5; ``combined = a·nTTFT + b·nTPOT``; ``least``: ``w = int((1 -
    combined)·100) + 1``, ``most``: ``w = int(combined·100) + 1``; score ``w / 100``
    (clamped to 1).
    Ours: ``bestEffortTTFTMs`` > 0 (default 0, off) routes a request that carries no SLO
    around the ``sloReserveEndpoints`` (1) endpoints kept for SLO traffic
    (``bestEffortPlacement: reserve``, the default; see ``_around_reserve``), or packs it onto
    the busiest endpoint within that bound (``pack``; see ``_pack``).
    Consumes ``LATENCY_PREDICTION`` (auto-creates ``predicted-latency-producer``); reads
    ``PREFIX_MATCH`` when present (the precise scorer's match instead, where one runs).
    """

    TYPE: ClassVar[str] = "latency-scorer"
    PARAMS: ClassVar[type[PluginParams]] = LatencyScorerParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({LATENCY_PREDICTION})

    def __init__(self, name: str, params: LatencyScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        total = params.ttft_weight + params.tpot_weight
        self.alpha, self.beta = (
            (params.ttft_weight / total, params.tpot_weight / total) if total > 0 else (0.5, 0.5)
        )
        self.strategy = params.headroom_selection_strategy
        self.best_effort_ttft = params.best_effort_ttft_ms
        self.placement = params.best_effort_placement
        self.reserve = params.slo_reserve_endpoints
        self.clock: Callable[[], float] = time.monotonic  # a plain attribute: tests inject a fake clock
        self.last_slo_at = -float("inf")
        self.slo_headroom = 0.0  # the most TTFT headroom (ms) the last request with an SLO had
        kv, q, pf = params.composite_kv_weight, params.composite_queue_weight, params.composite_prefix_weight
        s = kv + q + pf
        self.composite = (kv / s, q / s, pf / s) if s > 0 else (1.0, 0.0, 0.0)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(LATENCY_PREDICTION)
        if not any(_has_prediction(infos.get(ep)) for ep in endpoints):
            return self._composite(state, endpoints)
        if self.best_effort_ttft > 0:
            placed = self._best_effort(infos, endpoints)
            if placed is not None:
                return placed
        n = len(endpoints)
        positive: list[int] = []
        tpot_only: list[int] = []
        ttft_only: list[int] = []
        both: list[int] = []
        heads: list[tuple[float, float]] = []
        for i, ep in enumerate(endpoints):
            info = infos.get(ep)
            h = _headrooms(info) if _has_prediction(info) else (0.0, 0.0)
            heads.append(h)
            ttft_ok, tpot_ok = h[0] >= 0, h[1] >= 0
            if ttft_ok and tpot_ok:
                positive.append(i)
            elif ttft_ok:
                tpot_only.append(i)
            elif tpot_ok:
                ttft_only.append(i)
            else:
                both.append(i)
        scores = [0.0] * n
        if positive:
            self._bucket(positive, heads, scores, self.strategy)
            return scores
        idle = [i for i, ep in enumerate(endpoints) if _idle(infos.get(ep))]
        if idle:
            for i in idle:
                scores[i] = 1.0
            return scores
        for bucket in (tpot_only, ttft_only, both):
            if bucket:
                self._bucket(bucket, heads, scores, "least")
                break
        return scores

    def _best_effort(
        self, infos: Mapping[Hashable, Any], endpoints: Sequence[Endpoint]
    ) -> list[float] | None:
        """Scores for a request without an SLO (ours), or None: GIE's scoring.  A request with an
        SLO only records that SLO traffic is present."""
        got = [infos.get(ep) for ep in endpoints]
        if not all(_slo_free(i) for i in got if _has_prediction(i)):
            self.last_slo_at = self.clock()
            ttft = [i for i in got if i is not None and i.ttft_valid and i.ttft_headroom + i.ttft != 0.0]
            if ttft:  # it carries a TTFT SLO
                self.slo_headroom = max(i.ttft_headroom for i in ttft)
            return None
        if self.placement == "pack":
            return self._pack(got)
        return self._around_reserve(got)

    def _around_reserve(self, got: list[LatencyPredictionInfo | None]) -> list[float] | None:
        """Work-conserving best-effort routing: the ``sloReserveEndpoints`` endpoints with the
        lowest predicted TTFT for this request (the least prefill ahead: where the next SLO
        request will go) are kept for SLO traffic, and the request gets GIE's choice among
        the others (the lowest predicted TTFT and TPOT).

        A reserved endpoint is not held back from work that fits in the headroom SLO traffic
        has there: when this request's predicted TTFT on it is at most the TTFT headroom the
        last SLO request had (on its best endpoint), the SLO request after it would still be
        predicted within its SLO, so the request may take it.  The reserve is given up
        entirely (None: GIE's choice over all) when no SLO request was seen for
        ``SLO_RECENT_S``, or when every other endpoint predicts the first token later than
        ``bestEffortTTFTMs``: best-effort work then uses the reserve rather than wait."""
        if self.clock() - self.last_slo_at > SLO_RECENT_S:
            return None
        ranked = sorted((i.ttft, k) for k, i in enumerate(got) if i is not None and i.ttft_valid)
        rest = ranked[self.reserve :]
        if self.reserve == 0 or not rest or rest[0][0] > self.best_effort_ttft:
            return None
        rest += [(t, k) for t, k in ranked[: self.reserve] if t <= self.slo_headroom]
        heads = [_headrooms(i) for i in got]
        scores = [0.0] * len(got)
        self._bucket([k for _, k in rest], heads, scores, "least")
        return scores

    def _pack(self, got: list[LatencyPredictionInfo | None]) -> list[float] | None:
        """Best-effort packing (``bestEffortPlacement: pack``): the endpoint with the *least*
        TTFT headroom under ``bestEffortTTFTMs``, i.e. the busiest one still predicted to start
        it within that bound, so the endpoints with slack stay free for the requests that carry
        an SLO; not work-conserving (docs/latency-prediction.md#goodput).  None (GIE's
        behaviour) when no endpoint is predicted within the bound."""
        bound = self.best_effort_ttft
        fits = [k for k, i in enumerate(got) if i is not None and i.ttft_valid and i.ttft <= bound]
        if not fits:
            return None
        heads = [(bound - i.ttft, 0.0) if i is not None else (0.0, 0.0) for i in got]
        scores = [0.0] * len(got)
        self._bucket(fits, heads, scores, "least")
        return scores

    def _bucket(
        self, idx: list[int], heads: list[tuple[float, float]], out: list[float], strategy: str
    ) -> None:
        ttfts = [abs(heads[i][0]) for i in idx]
        tpots = [abs(heads[i][1]) for i in idx]
        t_min, t_max = min(ttfts), max(ttfts)
        p_min, p_max = min(tpots), max(tpots)
        t_range, p_range = t_max - t_min, p_max - p_min
        alpha, beta = self.alpha, self.beta
        if t_range <= 0 < p_range:
            alpha, beta = 0.0, 1.0
        elif p_range <= 0 < t_range:
            alpha, beta = 1.0, 0.0
        for k, i in enumerate(idx):
            nt = (ttfts[k] - t_min) / t_range if t_range > 0 else 0.5
            np_ = (tpots[k] - p_min) / p_range if p_range > 0 else 0.5
            combined = alpha * nt + beta * np_
            w = int((1.0 - combined) * 100) + 1 if strategy == "least" else int(combined * 100) + 1
            out[i] = min(w / 100.0, 1.0)

    def _composite(self, state: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        wk, wq, wp = self.composite
        max_q = max((ep.metrics.waiting_queue_size for ep in endpoints), default=0)
        prefix: Mapping[Hashable, Any] = prefix_matches(state)
        out = []
        for ep in endpoints:
            m = ep.metrics
            rel_q = (max_q - m.waiting_queue_size) / max_q if max_q > 0 else 1.0
            kv_free = 1.0 - m.kv_cache_usage_percent
            p = prefix.get(ep)
            pf = p.match_blocks / p.total_blocks if p is not None and p.total_blocks > 0 else 0.0
            out.append(min(max(round(100.0 * (wk * kv_free + wq * rel_q + wp * pf)) / 100.0, 0.0), 1.0))
        return out


def _idle(info: LatencyPredictionInfo | None) -> bool:
    return info is not None and info.dispatched_request_count == 0
