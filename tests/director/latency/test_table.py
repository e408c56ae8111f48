"""FeatureTable: the producer's feature matrix, predictions and infos equal the straightforward builder's.

The reference (``reference_matrix``) is how PrepareData built the matrix before the table:
read every candidate's metrics and in-flight counter for each request and call
``model.features``.  A seeded random run of requests, first tokens, completions, rescrapes,
endpoint replacements and candidate subsets drives the producer, and after every
PrepareData its matrix must equal the reference's bit for bit (``array_equal``), with the
same predictions and ``LatencyPredictionInfo`` objects.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from epp.datalayer.api import Endpoint, Metrics
from epp.datalayer.attributes import LATENCY_PREDICTION, PREFIX_MATCH, LatencyPredictionInfo, PrefixMatchInfo
from epp.director.latency.model import MIN_SAMPLES, N_FEATURES, FloatArray, features
from epp.director.latency.slo import SLO_TPOT_HEADER, SLO_TTFT_HEADER, slo_ms
from epp.director.latency.table import IDLE, FeatureTable, prefix_fractions
from epp.director.producers.predicted_latency import PredictedLatencyProducer, input_tokens
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.builders import make_endpoint
from epp.testing.plugins import build


def reference_matrix(
    p: PredictedLatencyProducer, state: CycleState, request: InferenceRequest, eps: Any, now: float
) -> FloatArray:
    """The matrix as PrepareData built it per request: every input read from every candidate."""
    counters = p.table.counters
    prefix = state.attributes(PREFIX_MATCH)
    metrics = [ep.metrics for ep in eps]
    load = [counters.get(ep.metadata.name, IDLE) for ep in eps]
    steps = [c.steps for c in load]

    def fraction(info: PrefixMatchInfo | None) -> float:
        return info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0

    f = np.array
    current = f([s.current for s in steps], dtype=np.float64)
    started = f([s.started for s in steps], dtype=np.float64)
    return features(
        f([m.kv_cache_usage_percent for m in metrics], dtype=np.float64),
        f([m.waiting_queue_size for m in metrics], dtype=np.float64),
        f([m.running_requests_size for m in metrics], dtype=np.float64),
        f([c.requests for c in load], dtype=np.float64),
        f([c.tokens for c in load], dtype=np.float64),
        f([fraction(prefix.get(ep)) for ep in eps] if prefix else [0.0] * len(eps), dtype=np.float64),
        float(input_tokens(request)),
        f([c.prefill for c in load], dtype=np.float64),
        current,
        f([s.queued for s in steps], dtype=np.float64),
        np.where(current > 0, now - started, 0.0),
        f([s.rate for s in steps], dtype=np.float64),
    )


def reference_infos(
    p: PredictedLatencyProducer, request: InferenceRequest, x: FloatArray, eps: Any
) -> list[Any]:
    fit = p.model.fit
    assert fit is not None
    pred = fit.predict(x)
    factor = p.params.slo_buffer_factor
    slo_ttft = slo_ms(request.headers, SLO_TTFT_HEADER) * factor
    slo_tpot = slo_ms(request.headers, SLO_TPOT_HEADER) * factor
    counters = p.table.counters
    return [
        LatencyPredictionInfo(
            fit.samples[0] >= MIN_SAMPLES, fit.samples[1] >= MIN_SAMPLES,
            slo_ttft - float(pred[i, 0]), slo_tpot - float(pred[i, 1]),
            float(pred[i, 0]), float(pred[i, 1]),
            counters.get(ep.metadata.name, IDLE).requests,
        )
        for i, ep in enumerate(eps)
    ]  # fmt: skip


def _metrics(rng: random.Random) -> Metrics:
    kv = rng.choice((0.0, 0.9, 1.0, rng.random(), 0.85 + 0.15 * rng.random()))  # the hinge at 0.9 included
    return Metrics(waiting_queue_size=rng.randrange(0, 30), running_requests_size=rng.randrange(0, 60),
                   kv_cache_usage_percent=kv)  # fmt: skip


def _prefix(rng: random.Random, eps: list[Endpoint]) -> dict[Any, PrefixMatchInfo] | None:
    kind = rng.randrange(4)
    if kind == 0:
        return None  # no prefix producer
    total = rng.choice((0, 4, 16))
    values: dict[Any, PrefixMatchInfo] = dict.fromkeys(eps, PrefixMatchInfo(0, total, 16))
    if kind >= 2:  # some matched, one missing
        for ep in rng.sample(eps, k=min(len(eps), rng.randrange(1, 4))):
            values[ep] = PrefixMatchInfo(rng.randrange(0, total + 1), total, 16)
        values.pop(rng.choice(eps))
    return values


def _fit(p: PredictedLatencyProducer, rng: np.random.Generator) -> None:
    for _ in range(200):
        x = rng.uniform(0, 3, N_FEATURES)
        x[0] = 1.0
        p.model.add_ttft(x, float(50 + 20 * x[1:].sum()))
        p.model.add_tpot(x, float(5 + x[1:].sum()))
    assert p.model.train() is not None


@pytest.mark.parametrize("seed", range(6))
def test_matrix_predictions_and_infos_equal_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    p = build(PredictedLatencyProducer)
    p.table = FeatureTable(capacity=2)  # grows during the run
    if seed % 2:
        _fit(p, np.random.default_rng(seed))
    now = [1000.0]
    p.clock = lambda: now[0]
    pool = [make_endpoint(i) for i in range(30)]  # candidate sets on both sides of _FIELD_BY_FIELD
    for ep in pool:
        ep.metrics = _metrics(rng)
    flight: list[tuple[CycleState, InferenceRequest, Endpoint, bool]] = []  # (..., first token seen)
    checked = 0
    for step in range(400):
        now[0] += rng.choice((0.0, 0.001, 0.05, 0.3, 6.0))  # 6 s: past the elapsed cap
        event = rng.randrange(10)
        if event == 0:  # rescrapes
            for ep in rng.sample(pool, k=rng.randrange(1, len(pool))):
                ep.metrics = _metrics(rng)
        elif event == 1 and flight:  # an endpoint replaced by a new object of the same name
            i = rng.randrange(len(pool))
            p.endpoint_removed(pool[i])
            pool[i] = make_endpoint(i)
            pool[i].metrics = _metrics(rng)
        elif event in (2, 3) and flight:  # a first token, or a completion (with or without one)
            k = rng.randrange(len(flight))
            state, r, target, seen = flight[k]
            resp = ResponseInfo(request_id=r.request_id, streaming=True, first_chunk_at=now[0])
            if event == 2 and not seen:
                p.response_body(state, r, resp, b"data: {}\n\n", target)
                flight[k] = (state, r, target, True)
            else:
                resp.end_of_stream, resp.completed_at = True, now[0]
                p.response_complete(state, r, resp, target)
                flight.pop(k)
        else:  # a request: PrepareData, checked, then dispatched
            shape = rng.randrange(3)
            eps: Any = tuple(pool) if shape == 0 else rng.sample(pool, k=rng.randrange(1, len(pool) + 1))
            if shape == 2:
                eps = tuple(eps)
            state = CycleState()
            prefix = _prefix(rng, list(eps))
            if prefix is not None:
                state.set_attributes(PREFIX_MATCH, prefix)
            headers = {"x-slo-ttft-ms": str(rng.randrange(50, 2000))} if rng.random() < 0.7 else {}
            r = InferenceRequest(request_id=f"r{step}", headers=headers, request_size_bytes=rng.randrange(0, 40000),
                                 received_at=now[0])  # fmt: skip
            p.prepare(state, r, eps)
            ctx = state.get(p._key)
            assert ctx is not None and ctx.x is not None
            ref = reference_matrix(p, state, r, eps, now[0])
            assert ctx.x.shape == ref.shape and np.array_equal(ctx.x, ref), np.argwhere(ctx.x != ref)
            if p.model.fit is not None:
                assert ctx.predictions is not None
                assert np.array_equal(ctx.predictions, p.model.fit.predict(ref))
                infos = state.attributes(LATENCY_PREDICTION)
                assert [infos[ep] for ep in eps] == reference_infos(p, r, ref, eps)
            checked += 1
            target = rng.choice(list(eps))
            p.pre_request(state, r, SchedulingResult({"default": ProfileRunResult((target,))}, "default"))
            flight.append((state, r, target, False))
    assert checked > 100


def test_prefix_fractions_none_without_information() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    zero = PrefixMatchInfo(0, 4, 16)
    assert prefix_fractions({}, eps) is None
    assert prefix_fractions(dict.fromkeys(eps, zero), eps) is None
    assert prefix_fractions({eps[0]: PrefixMatchInfo(3, 0, 16)}, eps) is None  # no blocks: no fraction
    got = prefix_fractions({eps[1]: PrefixMatchInfo(3, 4, 16)}, eps)
    assert got is not None and got.tolist() == [0.0, 0.75, 0.0]


def test_rows_follow_metrics_and_are_given_back() -> None:
    """A stored reading reaches the row without a request; a removed endpoint stops being listened to."""
    t = FeatureTable(capacity=1)
    a, b = make_endpoint(0, kv=0.5, queue=2), make_endpoint(1)
    x = t.assemble((a, b), 100.0, None, 0.0)  # the second row grows the array
    assert x[:, 1].tolist() == [0.5, 0.0] and x[:, 3].tolist() == [2.0, 0.0]
    b.metrics = Metrics(kv_cache_usage_percent=0.95, waiting_queue_size=7)
    x = t.assemble((a, b), 100.0, None, 0.0)
    assert x[1, 1] == 0.95 and x[1, 3] == 7.0 and x[1, 20] == pytest.approx(0.5)
    t.remove(b)
    b.metrics = Metrics(waiting_queue_size=9)  # no longer heard: no error, nothing written
    c = make_endpoint(1)  # the same name, a new object: takes the freed row
    x = t.assemble((c,), 100.0, None, 0.0)
    assert x[0, 3] == 0.0
