"""The in-process latency model: learns a known function, bounded memory, atomic swaps, off-loop training."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from epp.director.latency.model import (
    FEATURE_NAMES,
    LEARNERS,
    MIN_SAMPLES,
    N_FEATURES,
    LatencyModel,
    features,
    mdape,
)
from epp.director.latency.steps import StepClock


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """n feature rows of one endpoint each, over realistic ranges."""
    kv = rng.uniform(0, 0.9, n)
    waiting = rng.integers(0, 8, n).astype(float)
    running = rng.integers(0, 64, n).astype(float)
    infl = rng.integers(0, 16, n).astype(float)
    prefix = rng.uniform(0, 1, n)
    rows = [
        features(kv[i : i + 1], waiting[i : i + 1], running[i : i + 1], infl[i : i + 1], infl[i : i + 1] * 800,
                 prefix[i : i + 1], float(rng.integers(50, 8000)))[0]
        for i in range(n)
    ]  # fmt: skip
    return np.array(rows)


def truth(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A linear-ish engine: TTFT = step + queue + prefill of uncached tokens; TPOT = batch cost."""
    kv, waiting, running, uncached = x[:, 1], x[:, 3], x[:, 4], x[:, 8]
    ttft = 8 + 30 * waiting + 45 * uncached + 0.1 * running * (1 + uncached) + 20 * kv
    tpot = 6 + 0.1 * running + 4 * kv
    return ttft, tpot


@pytest.mark.parametrize(
    ("learner", "ttft_mdape"),
    [
        ("ridge", 10.0),
        ("ridge-rel", 10.0),
        ("huber", 10.0),
        ("ridge-log", 15.0),
    ],  # a log-linear model only approximates a sum
)
def test_learns_a_known_function(learner: str, ttft_mdape: float) -> None:
    rng = np.random.default_rng(1)
    model = LatencyModel(capacity=2000, learner=learner)
    assert learner in LEARNERS
    x = random_rows(rng, 1500)
    ttft, tpot = truth(x)
    noise = rng.normal(1.0, 0.03, (2, len(x)))
    for row, a, b in zip(x, ttft * noise[0], tpot * noise[1], strict=True):
        model.add_ttft(row, float(a))
        model.add_tpot(row, float(b))
    assert model.predict(x[:1]) is None  # nothing before the first training
    fit = model.train()
    assert fit is not None and fit.samples == (1500, 1500)
    test = random_rows(rng, 300)
    t_ttft, t_tpot = truth(test)
    pred = model.predict(test)
    assert pred is not None and pred.shape == (300, 2)
    assert mdape(pred[:, 0].tolist(), t_ttft.tolist()) < ttft_mdape
    assert mdape(pred[:, 1].tolist(), t_tpot.tolist()) < 5.0


def test_work_columns() -> None:
    """work = own uncached + queued prefill (thousands of tokens); its log and its product with running."""
    x = features(np.array([0.1, 0.2]), np.zeros(2), np.array([2.0, 4.0]), np.zeros(2), np.zeros(2),
                 np.array([0.5, 0.0]), 1000.0, np.array([0.0, 3000.0]))  # fmt: skip
    assert x.shape == (2, N_FEATURES)
    assert x[:, 12].tolist() == pytest.approx([0.5, 4.0])
    assert x[:, 13].tolist() == pytest.approx(np.log([0.55, 4.05]).tolist())
    assert x[:, 14].tolist() == pytest.approx([1.0, 16.0])
    # without a queued-prefill column, work is the request's own uncached tokens
    alone = features(np.array([0.1]), np.zeros(1), np.ones(1), np.zeros(1), np.zeros(1), np.zeros(1), 2000.0)
    assert alone[0, 12] == pytest.approx(2.0)


def test_log_model_follows_queueing_through_the_work_feature() -> None:
    """TTFT linear in the prefill queued ahead (a queue): the log model stays within 15 % over a 20x range."""
    rng = np.random.default_rng(2)
    n = 1500
    queued = rng.exponential(3000.0, n)  # tokens ahead, long-tailed like a queue
    x = np.array([
        features(np.array([rng.uniform(0, 0.8)]), np.zeros(1), np.array([float(rng.integers(0, 32))]),
                 np.zeros(1), np.zeros(1), np.array([rng.uniform(0, 1)]), float(rng.integers(100, 3000)),
                 np.array([q]))[0]
        for q in queued
    ])  # fmt: skip
    ttft = 10 + 50 * x[:, 12] + 0.2 * x[:, 14]  # step + prefill throughput + decodes riding along
    model = LatencyModel(capacity=2000, learner="ridge-log")
    for row, y in zip(x, ttft * rng.normal(1.0, 0.03, n), strict=True):
        model.add_ttft(row, float(y))
        model.add_tpot(row, 10.0)
    model.train()
    pred = model.predict(x)
    assert pred is not None
    heavy = x[:, 12] > np.quantile(x[:, 12], 0.9)  # the tail, where a queue is nonlinear in the counts
    assert mdape(pred[:, 0].tolist(), ttft.tolist()) < 15.0
    assert mdape(pred[heavy, 0].tolist(), ttft[heavy].tolist()) < 15.0


def test_needs_min_samples_and_memory_is_bounded() -> None:
    model = LatencyModel(capacity=50)
    row = np.ones(N_FEATURES)
    for _ in range(MIN_SAMPLES - 1):
        model.add_ttft(row, 10.0)
    assert model.train() is None and model.fit is None
    for _ in range(500):
        model.add_ttft(row, 10.0)
    assert model.counts() == (50, 0)  # the ring keeps the newest 50
    fit = model.train()
    assert fit is not None and fit.samples == (50, 0)
    pred = model.predict(row[None, :])
    assert pred is not None and pred[0, 0] == pytest.approx(10.0, rel=1e-3)  # TPOT: untrained, not valid


def test_a_new_fit_replaces_the_reference() -> None:
    """Training builds a new Fit; a reader holding the old one keeps a complete model."""
    model = LatencyModel(capacity=100)
    row = np.ones(N_FEATURES)
    for _ in range(40):
        model.add_ttft(row, 10.0)
        model.add_tpot(row, 2.0)
    old = model.train()
    for _ in range(100):
        model.add_ttft(row, 20.0)
    new = model.train()
    assert old is not None and new is not None and new is not old and model.fit is new
    assert old.predict(row[None, :])[0, 0] == pytest.approx(10.0, rel=1e-3)
    assert new.predict(row[None, :])[0] == pytest.approx([20.0, 2.0], rel=1e-3)  # TPOT rows kept


async def test_training_does_not_block_the_event_loop() -> None:
    """A long training in a worker thread: the loop keeps ticking every few ms meanwhile."""
    rng = np.random.default_rng(2)
    model = LatencyModel(capacity=400_000)
    rows = rng.uniform(0, 4, (400_000, N_FEATURES))
    model._ttft.x[:] = rows  # bulk fill (the public path adds one row at a time)
    model._ttft.y[:] = rows.sum(axis=1) + 1.0
    model._ttft.count = 400_000
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    fit = await asyncio.to_thread(model.train)
    took = time.perf_counter() - t0
    done.set()
    await tick
    assert fit is not None
    assert took > 0.05, f"training too short ({took:.3f}s) to show anything"
    assert len(gaps) > 5
    assert max(gaps) < max(0.05, took / 2), f"loop stalled {max(gaps) * 1000:.1f} ms during a {took:.3f}s fit"


@pytest.mark.parametrize("learner", LEARNERS)
def test_quantile_shifts_predictions_to_cover_that_share(learner: str) -> None:
    """quantile=0.9: about 90% of (noisy) targets fall at or below the prediction."""
    rng = np.random.default_rng(3)
    model = LatencyModel(capacity=3000, learner=learner, quantile=0.9)
    x = random_rows(rng, 3000)
    ttft, tpot = truth(x)
    noisy = ttft * rng.lognormal(0.0, 0.2, len(x))
    for row, a, b in zip(x, noisy, tpot, strict=True):
        model.add_ttft(row, float(a))
        model.add_tpot(row, float(b))
    model.train()
    pred = model.predict(x)
    assert pred is not None
    covered = float(np.mean(noisy <= pred[:, 0]))
    assert 0.85 <= covered <= 0.95, covered
    with pytest.raises(ValueError, match="quantile"):
        LatencyModel(quantile=1.0)


def batching_engine(rng: np.random.Generator, n: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows and TTFTs (ms) of Poisson arrivals to one engine that admits every waiting prompt
    into its next step (step = 6 ms + 0.05 ms per prompt token; all of a step's requests get their
    first token when it ends), the rows built as the producer builds them (a ``StepClock``)."""
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    tokens = rng.uniform(200, 3000, n)
    clock = StepClock()
    rows = np.zeros((n, N_FEATURES))
    ttft = np.zeros(n)
    step_of = np.zeros(n, dtype=int)
    pending = 0.0
    waiting: list[int] = []
    running: tuple[float, list[int]] | None = None  # (end, members)
    i = 0
    while i < n or running is not None:
        if i < n and (running is None or arrivals[i] < running[0]):
            t = float(arrivals[i])
            one = np.zeros(1)
            rows[i] = features(one, np.array([float(len(waiting))]), one, one, one, one, float(tokens[i]),
                               np.array([pending]), np.array([clock.current]), np.array([clock.queued]),
                               np.array([clock.elapsed(t)]))[0]  # fmt: skip
            step_of[i] = clock.dispatch(float(tokens[i]), t)
            pending += tokens[i]
            waiting.append(i)
            i += 1
        else:
            assert running is not None
            t, members = running
            running = None
            for j in members:
                ttft[j] = 1000.0 * (t - arrivals[j])
                clock.first_token(int(step_of[j]), float(tokens[j]), t)
                pending -= tokens[j]
        if running is None and waiting:
            start = t
            running = (start + (6.0 + 0.05 * float(tokens[waiting].sum())) / 1000.0, waiting)
            waiting = []
    return rows, ttft


def test_step_features_predict_a_batching_engine_the_work_ahead_alone_cannot() -> None:
    """TTFT = rest of the running step + the next step: with the step columns the error falls by a
    quarter or more against the first 15 columns (the model before them), same learner and rows."""
    rng = np.random.default_rng(1)
    x, ttft = batching_engine(rng, 2500, rate=8.0)  # busy: most requests wait behind a running step
    errors = {}
    for width in (15, N_FEATURES):
        model = LatencyModel(capacity=2000, learner="huber", width=width)
        for row, y in zip(x[:2000, :width], ttft[:2000], strict=True):
            model.add_ttft(row, float(y))
        model.train()
        pred = model.predict(x[2000:, :width])
        assert pred is not None
        errors[width] = mdape(pred[:, 0].tolist(), ttft[2000:].tolist())
    assert errors[N_FEATURES] < 9.0, errors
    assert errors[N_FEATURES] < 0.75 * errors[15], errors


def test_huber_is_not_pulled_by_a_few_gross_errors() -> None:
    """5 % of the rows 4x too slow (a stall no feature sees): least squares shifts every prediction,
    the Huber fit keeps the typical row right."""
    rng = np.random.default_rng(4)
    x = random_rows(rng, 2000)
    ttft, _ = truth(x)
    observed = ttft * rng.normal(1.0, 0.03, len(x))
    stalled = rng.random(len(x)) < 0.05
    observed[stalled] *= 4.0
    errors = {}
    for learner in ("ridge", "huber"):
        model = LatencyModel(capacity=2000, learner=learner)
        for row, y in zip(x, observed, strict=True):
            model.add_ttft(row, float(y))
        model.train()
        pred = model.predict(x[~stalled])
        assert pred is not None
        errors[learner] = mdape(pred[:, 0].tolist(), ttft[~stalled].tolist())
    assert errors["huber"] < 5.0, errors
    assert errors["huber"] < 0.5 * errors["ridge"], errors


def test_step_columns() -> None:
    """The step columns: tokens in the running step, queued + own uncached (and its log), elapsed
    capped at 5 s and at the running step's length at the recent prefill rate; the KV-full hinge."""
    x = features(np.array([0.5, 0.95]), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), np.array([0.5, 0.0]),
                 1000.0, np.array([0.0, 3000.0]), np.array([0.0, 2000.0]), np.array([0.0, 1000.0]),
                 np.array([0.0, 60.0]), np.array([0.0, 10_000.0]))  # fmt: skip
    names = ("step_current_k", "step_ahead_k", "step_elapsed_s", "log_step_ahead", "step_elapsed_capped_s")
    cols = [FEATURE_NAMES.index(n) for n in names]
    assert x[0, cols].tolist() == pytest.approx([0.0, 0.5, 0.0, float(np.log(0.55)), 0.0])
    # 2000 tokens at 10k tokens/s: the running step should have ended after 0.2 s
    assert x[1, cols].tolist() == pytest.approx([2.0, 2.0, 5.0, float(np.log(2.05)), 0.2])
    full = [
        FEATURE_NAMES.index(n)
        for n in ("kv_full", "kv_full_x_ahead_k", "kv_full_x_work_k", "kv_full_x_elapsed_s")
    ]
    assert x[0, full].tolist() == [0.0, 0.0, 0.0, 0.0]  # half full: below the hinge
    assert x[1, full].tolist() == pytest.approx([0.5, 1.0, 2.0, 2.5])  # work = 3000 queued + 1000 own
    unknown = features(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), 100.0,
                       None, np.array([500.0]), np.zeros(1), np.array([0.3]), np.zeros(1))  # fmt: skip
    assert unknown[0, FEATURE_NAMES.index("step_elapsed_capped_s")] == pytest.approx(
        0.3
    )  # no rate yet: uncapped
    assert len(FEATURE_NAMES) == N_FEATURES
