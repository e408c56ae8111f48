"""Recorded scheduling outcomes: what the profile picked and explained, request by request.

``scenarios()`` replays seeded request sequences on generated fleets: metrics-only scorers (the
profile's score cache: rebuilt, updated per request, updated as samples arrive), request-dependent
ones (prefix, LoRA, token load) and an unbounded one whose scores need clamping, filters, the
max-score and weighted-random pickers, samples stored between requests, candidate lists that
change, requests that ask for an explanation and some whose filters leave nothing.  Each request
is reduced to a digest of its exact outcome: the picked endpoints, the floats the picker was
handed, and for an explained request its ``scored`` list and ``ProfileTrace`` (survivors per
filter, per-scorer contributions, totals), floats in ``float.hex``.

tests/scheduling/scheduler_vectors.json holds the digests the scheduler gave when they were
recorded (``python -m tests.scheduling.vectors`` rewrites it: do that only on purpose, when a
routing change is meant); test_vectors.py checks today's scheduler gives the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.datalayer.attributes import INFLIGHT_LOAD, PREFIX_MATCH, InFlightLoad, PrefixMatchInfo
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import PROFILE_TRACES, ScorerCategory
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.weighted_random import WeightedRandomPicker
from epp.scheduling.scheduler import SchedulerProfile, SchedulingError
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsSizeScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.testing.plugins import build
from tests.scheduling.builders import DropFilter, Recording, request

VECTORS = Path(__file__).with_name("scheduler_vectors.json")
SCENARIOS = 60
REQUESTS = 24
MODELS = ("base", "lora-a", "lora-b")


class WildScorer(PluginBase):
    """Request-dependent and unbounded: scores from the request id, some out of [0, 1] or NaN."""

    TYPE: ClassVar[str] = "test-wild-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE

    def __init__(self) -> None:
        super().__init__("wild", None, None)  # type: ignore[arg-type]

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        rng = random.Random(request.request_id)
        return [rng.choice((rng.random(), -0.25, 1.5, math.nan, 1.0)) for _ in endpoints]


class DropAllOnSevens(DropFilter):
    """``DropFilter``, and every endpoint for a request id ending in 7 (a run with no survivors)."""

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        return [] if request.request_id.endswith("7") else super().filter(state, request, endpoints)


def _metrics(rng: random.Random, hi: int) -> Metrics:
    return Metrics(
        waiting_queue_size=rng.randint(0, hi),
        running_requests_size=rng.randint(0, hi),
        kv_cache_usage_percent=rng.choice((rng.random(), 0.0, 1.0, 1.25, math.nan)),
        active_models=frozenset(rng.sample(MODELS, rng.randint(0, 2))),
        waiting_models=frozenset(rng.sample(MODELS, rng.randint(0, 1))),
        max_active_models=rng.randint(0, 3),
    )


def _endpoint(rng: random.Random, i: int, hi: int) -> Endpoint:
    md = EndpointMetadata(
        name=f"ns/pod-{i}", address=f"10.0.{i // 256}.{i % 256}", port=8000, pod_name=str(i)
    )
    return Endpoint(md, _metrics(rng, hi))


def _sample(rng: random.Random, ep: Endpoint, hi: int) -> None:
    """A stored sample: a small step, a jump to the fleet's extremes, or an equal reading."""
    m = ep.metrics
    r = rng.random()
    if r < 0.2:
        ep.metrics = replace(m)
    elif r < 0.6:
        q = max(m.waiting_queue_size + rng.choice((-1, 1)), 0)
        ep.metrics = replace(m, waiting_queue_size=q, kv_cache_usage_percent=rng.random())
    else:
        ep.metrics = _metrics(rng, rng.choice((0, hi, 3 * hi)))


def _state(rng: random.Random, eps: Sequence[Endpoint]) -> CycleState:
    state = CycleState()
    if rng.random() < 0.8:
        total = rng.choice((0, 4, 16))
        state.set_attributes(
            PREFIX_MATCH,
            {ep: PrefixMatchInfo(rng.randint(0, total), total, 16) for ep in eps if rng.random() < 0.8},
        )
    if rng.random() < 0.6:
        loads: dict[Hashable, InFlightLoad] = {
            ep: InFlightLoad(rng.randint(0, 3), rng.choice((0, 5, 500))) for ep in eps
        }
        state.set_attributes(INFLIGHT_LOAD, loads)
    return state


def churn(
    rng: random.Random, fleet: list[Endpoint], candidates: Sequence[Endpoint], hi: int, *, empty: bool = False
) -> Sequence[Endpoint]:
    """What changes between two requests: new metric samples, and now and then a new endpoint,
    a subset of the fleet, or the same candidates as a list or a fresh tuple (and, with
    ``empty``, none at all).  The RNG draws are those the recorded vectors were made with."""
    for _ in range(rng.choice((0, 0, 1, 2, 5, 40))):
        _sample(rng, rng.choice(fleet), hi)
    c = rng.random()
    if c < 0.1:
        fleet.append(_endpoint(rng, len(fleet), hi))
        return tuple(fleet)
    if c < 0.2:
        return tuple(ep for ep in fleet if rng.random() < 0.8) or tuple(fleet)
    if c < 0.25:
        return list(candidates)
    if c < 0.3:
        return tuple(candidates)
    if empty and c < 0.32:
        return ()
    return candidates


def _hex(values: Sequence[float]) -> list[str]:
    return [float(v).hex() for v in values]


def _names(eps: Sequence[Endpoint]) -> list[str]:
    return [ep.metadata.pod_name for ep in eps]


def _scorers(rng: random.Random) -> list[tuple[Any, float]]:
    kinds = rng.sample(range(7), rng.randint(0, 6))
    out: list[tuple[Any, float]] = []
    for k in kinds:
        w = rng.choice((1.0, 2.0, 3.0, 0.5, rng.uniform(-1.0, 5.0)))
        plugin: Any
        if k == 0:
            plugin = build(QueueScorer)
        elif k == 1:
            plugin = build(KVCacheUtilizationScorer)
        elif k == 2:
            plugin = build(RunningRequestsSizeScorer)
        elif k == 3:
            plugin = build(PrefixCacheScorer)
        elif k == 4:
            plugin = build(LoraAffinityScorer)
        elif k == 5:
            plugin = build(TokenLoadScorer, queueThresholdTokens=rng.choice((0, 10, 1000)))
        else:
            plugin = WildScorer()
        out.append((plugin, w))
    return out


def scenario(seed: int) -> Iterator[str]:
    """The digest of each request's outcome in scenario ``seed``."""
    rng = random.Random(seed)
    hi = rng.choice((0, 3, 50))
    fleet = [_endpoint(rng, i, hi) for i in range(rng.choice((1, 3, 10, 40, 120)))]
    inner: MaxScorePicker | WeightedRandomPicker
    if rng.random() < 0.7:
        inner = build(MaxScorePicker, maxNumOfEndpoints=rng.choice((1, 1, 2, 5)))
    else:
        inner = build(WeightedRandomPicker, maxNumOfEndpoints=rng.choice((1, 3)))
    inner.rng = random.Random(seed + 1)
    picker = Recording(inner)
    filters: list[Any] = []
    if rng.random() < 0.4:
        filters.append(DropAllOnSevens(frozenset(i for i in range(len(fleet)) if rng.random() < 0.2)))
    profile = SchedulerProfile("p", filters=filters, scorers=_scorers(rng), picker=picker)
    candidates: Sequence[Endpoint] = tuple(fleet)
    for r in range(REQUESTS):
        candidates = churn(rng, fleet, candidates, hi)
        state = _state(rng, candidates)
        req = request(model=rng.choice(MODELS), request_id=f"r{seed}-{r}")
        req.explain = rng.random() < 0.4
        picker.seen = []
        try:
            result = profile.run(state, req, candidates)
            record: list[Any] = [_names(result.target_endpoints), _hex(picker.seen)]
            record.append([(ep.metadata.pod_name, t.hex()) for ep, t in result.scored])
        except SchedulingError as e:
            record = ["error", str(e)]
        for t in state.get(PROFILE_TRACES) or ():
            record.append(
                [
                    t.profile,
                    _names(t.candidates),
                    [(f, _names(eps)) for f, eps in t.filters],
                    [(s, w.hex()) for s, w in t.scorers],
                    _names(t.scored),
                    [_hex(c) for c in t.contributions],
                    _hex(t.totals),
                    t.picker,
                    _names(t.picked),
                    t.error,
                ]
            )
        yield hashlib.sha256(json.dumps(record).encode()).hexdigest()[:16]


def record() -> dict[str, list[str]]:
    return {str(seed): list(scenario(seed)) for seed in range(SCENARIOS)}


if __name__ == "__main__":
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in record().items()]
    VECTORS.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {VECTORS}")
