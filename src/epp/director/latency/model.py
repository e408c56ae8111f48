"""The in-process latency model behind ``predicted-latency-producer``: TTFT and TPOT per (request, endpoint).

GIE calls two sidecars (an XGBoost training server and prediction servers) over HTTP.  Here
the model lives in the EPP process:

* **Features** (``features``): for each candidate endpoint, the scraped KV-cache use, waiting
  and running requests, the request's input tokens, its prefix-cache match fraction on that
  endpoint, and the requests / estimated tokens this EPP has dispatched there and not yet seen
  finish — the inputs of GIE's predictor — plus three products that make a linear model fit
  the shape of an engine step (``running x uncached input``, ``kv²``, ``waiting x input``),
  and the **prefill work ahead**: the uncached prompt tokens this EPP sent to the endpoint
  whose first token it has not seen yet, plus this request's own.  TTFT is roughly that work
  divided by the endpoint's prefill throughput, so it is the feature that keeps queueing
  linear for the learner (``work``, ``log work``, ``running x work``).  The same prefill split
  by **engine step** (``steps.StepClock``): the running step's tokens and how long it has run,
  the tokens queued for the next step (which this request joins); and a hinge for a full KV
  cache, where admission waits for blocks instead of steps.
* **Prediction** is one ``(n, d) @ (d, 2)`` product for all candidates of a request: column 0
  is TTFT, column 1 TPOT (ms).  The weights are one immutable ``Fit``; training replaces the
  reference atomically, so a prediction never sees half a model.
* **Training** is a linear model of the latency in ms fitted by reweighted ridge (``huber``:
  relative Huber loss, a few ``numpy.linalg.solve`` of ``(d, d)``; ``ridge-log`` and others
  for comparison) over a bounded ring buffer of recent samples, run by ``train()`` in a worker
  thread (``asyncio.to_thread``): the event loop only appends rows (a few µs) and swaps the
  reference.  numpy releases the GIL inside the matrix products and the solves.  With
  ``quantile`` != 0.5 the predictions are scaled by that quantile of actual / fitted (a p90 by
  default in the producer, as GIE's predictors).  docs/latency-prediction.md has the
  measurements behind the features and the choice of learner.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

N_FEATURES: Final = 24
FEATURE_NAMES: Final = (
    "bias",
    "kv",
    "kv2",
    "waiting",
    "running",
    "inflight_requests",
    "inflight_tokens_k",
    "input_tokens_k",
    "uncached_tokens_k",
    "prefix_fraction",
    "running_x_uncached_k",
    "waiting_x_input_k",
    "work_k",
    "log_work",
    "running_x_work_k",
    "step_current_k",
    "step_ahead_k",
    "step_elapsed_s",
    "log_step_ahead",
    "step_elapsed_capped_s",
    "kv_full",
    "kv_full_x_ahead_k",
    "kv_full_x_work_k",
    "kv_full_x_elapsed_s",
)
LEARNERS: Final = ("ridge-log", "huber", "ridge-rel", "ridge")
DEFAULT_LEARNER: Final = "huber"
MIN_SAMPLES: Final = 16  # a dimension's prediction is valid once its model saw this many samples
_FLOOR_MS: Final = 0.01  # targets are clamped here before the log
HUBER_K: Final = 1.345  # Huber's threshold in robust standard deviations (95 % efficiency for normal errors)
HUBER_ITERATIONS: Final = 3  # reweighted solves after the first (each a (d x d) solve: ~0.1 ms)
_WORK_OFFSET_K: Final = 0.05  # 50 tokens: log(work) stays finite for a fully cached prompt
_MAX_ELAPSED_S: Final = 5.0  # a step "running" longer than this is a lost first token, not a step
_KV_FULL: Final = 0.9  # KV-cache use from which admission waits for blocks (the hinge of the kv_full columns)


def features(
    kv: FloatArray,
    waiting: FloatArray,
    running: FloatArray,
    inflight_requests: FloatArray,
    inflight_tokens: FloatArray,
    prefix_fraction: FloatArray,
    input_tokens: float,
    queued_prefill_tokens: FloatArray | None = None,
    step_current: FloatArray | None = None,
    step_queued: FloatArray | None = None,
    step_elapsed: FloatArray | None = None,
    prefill_rate: FloatArray | None = None,
) -> FloatArray:
    """The ``(n, N_FEATURES)`` feature matrix of one request over ``n`` endpoints (vectorised).

    ``queued_prefill_tokens``: per endpoint, the uncached prompt tokens of the requests this EPP
    dispatched there that have not produced their first token yet (the prefill queued ahead).
    ``step_current`` / ``step_queued`` / ``step_elapsed``: the same prefill split by engine step
    (``steps.StepClock``): tokens in the step running now, tokens waiting for the next one (which
    this request joins), and the seconds the running step has been going; ``prefill_rate``: the
    endpoint's recent prefill tokens per busy second (``StepClock.rate``, 0 when unknown).

    This is the definition (and the offline replay's builder); the producer assembles the same
    matrix from rows it keeps up to date (``table.FeatureTable``), so a change here is a change
    there too: tests/director/latency/test_table.py compares the two bit for bit.
    """
    n = kv.shape[0]
    x = np.empty((n, N_FEATURES))
    input_k = input_tokens / 1000.0
    uncached = input_k * (1.0 - prefix_fraction)
    x[:, 0] = 1.0
    x[:, 1] = kv
    x[:, 2] = kv * kv
    x[:, 3] = waiting
    x[:, 4] = running
    x[:, 5] = inflight_requests
    x[:, 6] = inflight_tokens / 1000.0
    x[:, 7] = input_k
    x[:, 8] = uncached
    x[:, 9] = prefix_fraction
    x[:, 10] = running * uncached
    x[:, 11] = waiting * input_k
    work = uncached if queued_prefill_tokens is None else uncached + queued_prefill_tokens / 1000.0
    x[:, 12] = work
    x[:, 13] = np.log(work + _WORK_OFFSET_K)
    x[:, 14] = running * work
    # TTFT ≈ rest of the running step (its tokens minus the time it has run) + the next step
    x[:, 15] = 0.0 if step_current is None else step_current / 1000.0
    ahead = uncached if step_queued is None else uncached + step_queued / 1000.0
    x[:, 16] = ahead
    x[:, 17] = 0.0 if step_elapsed is None else np.minimum(step_elapsed, _MAX_ELAPSED_S)
    x[:, 18] = np.log(ahead + _WORK_OFFSET_K)
    # a step cannot have run longer than its tokens take at the endpoint's recent prefill rate:
    # past that the clock is stale (a stalled queue), and a linear "rest of the step" must not go
    # negative
    if prefill_rate is None:
        x[:, 19] = x[:, 17]
    else:
        length = np.where(prefill_rate > 0, x[:, 15] * 1000.0 / np.maximum(prefill_rate, 1.0), np.inf)
        x[:, 19] = np.minimum(x[:, 17], length)
    # a full KV cache admits nothing until running requests free blocks: another regime (a hinge)
    full = np.maximum(kv - _KV_FULL, 0.0) / (1.0 - _KV_FULL)
    x[:, 20] = full
    x[:, 21] = full * ahead
    x[:, 22] = full * work
    x[:, 23] = full * x[:, 17]
    return x


@dataclass(frozen=True, slots=True)
class Fit:
    """One trained model: ``predict(x) = transform(((x - mean) / scale) @ weights)``, per target."""

    mean: FloatArray  # (d,)
    scale: FloatArray  # (d,)
    weights: FloatArray  # (d, 2)
    log_target: bool
    samples: tuple[int, int]  # training rows behind each column (TTFT, TPOT)
    floor: FloatArray  # (2,) the smallest target seen: a linear model must not extrapolate below it

    def predict(self, x: FloatArray) -> FloatArray:
        """``(n, 2)`` predictions in ms: TTFT, TPOT."""
        y = ((x - self.mean) / self.scale) @ self.weights
        if self.log_target:
            y = np.exp(np.minimum(y, 20.0))  # exp(20) ms ≈ 5.6 h: a cap, not a prediction
        return np.maximum(y, self.floor)


class _Ring:
    """A bounded buffer of (features, target) rows; the newest ``capacity`` rows are kept."""

    __slots__ = ("count", "pos", "x", "y")

    def __init__(self, capacity: int, width: int) -> None:
        self.x = np.zeros((capacity, width))
        self.y = np.zeros(capacity)
        self.pos = 0
        self.count = 0

    def add(self, x: FloatArray, y: float) -> None:
        i = self.pos
        self.x[i] = x
        self.y[i] = y
        self.pos = (i + 1) % self.y.shape[0]
        if self.count < self.y.shape[0]:
            self.count += 1

    def snapshot(self) -> tuple[FloatArray, FloatArray]:
        n = self.count
        return self.x[:n].copy(), self.y[:n].copy()


class LatencyModel:
    """Online TTFT/TPOT model: rows are added on the event loop, ``train()`` runs anywhere.

    ``add_ttft`` / ``add_tpot`` keep the newest ``capacity`` rows per target (a ring: memory
    is bounded); the producer decides which observations become rows (its sampling).
    ``fit`` is the current ``Fit`` or None before the first training; reading it is one
    attribute load.
    """

    def __init__(
        self,
        capacity: int = 1000,
        learner: str = DEFAULT_LEARNER,
        quantile: float = 0.5,
        width: int = N_FEATURES,
    ) -> None:
        if learner not in LEARNERS:
            raise ValueError(f"unknown learner {learner!r}; one of {', '.join(LEARNERS)}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        self.learner = learner
        self.quantile = quantile
        self.width = width  # feature columns (``N_FEATURES``; offline studies try other sets)
        self._ttft = _Ring(capacity, width)
        self._tpot = _Ring(capacity, width)
        self._lock = threading.Lock()  # rows are added on the loop, snapshotted by the trainer
        self._new = 0
        self.fit: Fit | None = None
        self.trainings = 0

    @property
    def pending(self) -> int:
        """Rows added since the last training started."""
        return self._new

    def add_ttft(self, x: FloatArray, ttft_ms: float) -> None:
        with self._lock:
            self._ttft.add(x, ttft_ms)
            self._new += 1

    def add_tpot(self, x: FloatArray, tpot_ms: float) -> None:
        with self._lock:
            self._tpot.add(x, tpot_ms)
            self._new += 1

    def counts(self) -> tuple[int, int]:
        return self._ttft.count, self._tpot.count

    def train(self) -> Fit | None:
        """Fit both targets on the current rows and swap the model in; thread-safe, blocking.

        Returns the new fit, or None (model unchanged) when no target has enough rows.
        """
        with self._lock:
            xt, yt = self._ttft.snapshot()
            xp, yp = self._tpot.snapshot()
            self._new = 0
        if max(len(yt), len(yp)) < MIN_SAMPLES:
            return None
        old = self.fit
        # One shared standardisation (from the larger set) so one product predicts both.
        base = xt if len(yt) >= len(yp) else xp
        mean = base.mean(axis=0)
        scale = base.std(axis=0)
        mean[0], scale[0] = 0.0, 1.0
        scale[scale < 1e-9] = 1.0
        weights = np.zeros((self.width, 2))
        floor = np.zeros(2)
        log_target = self.learner.endswith("-log")
        for col, (x, y) in enumerate(((xt, yt), (xp, yp))):
            if len(y) >= MIN_SAMPLES:
                _, _, w = _fit_with(x, y, self.learner, mean, scale)
                if self.quantile != 0.5:  # a multiplicative margin: the quantile of actual / predicted
                    fitted = ((x - mean) / scale) @ w
                    if log_target:
                        w[0] += float(np.quantile(np.log(np.maximum(y, _FLOOR_MS)) - fitted, self.quantile))
                    else:  # scaling every weight scales the prediction
                        w *= float(np.quantile(y / np.maximum(fitted, y.min()), self.quantile))
                weights[:, col] = w
                floor[col] = float(y.min())
            elif old is not None:  # keep what we had for this target, re-expressed in the new scaling
                weights[:, col] = _rescale(old, col, mean, scale)
                floor[col] = old.floor[col]
        fit = Fit(mean, scale, weights, log_target, (len(yt), len(yp)), floor)
        self.fit = fit  # the atomic swap: one reference store
        self.trainings += 1
        return fit

    def predict(self, x: FloatArray) -> FloatArray | None:
        """``(n, 2)`` TTFT/TPOT ms, or None before the first training."""
        fit = self.fit
        return None if fit is None else fit.predict(x)


def _fit_with(
    x: FloatArray, y: FloatArray, learner: str, mean: FloatArray, scale: FloatArray, alpha: float = 1e-2
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Closed-form ridge on standardised features (a few reweighted solves for ``huber``).

    ``ridge-log`` fits ``log(y)`` (errors relative to the target, close to what MdAPE
    measures); ``ridge`` fits ``y``; ``ridge-rel`` fits ``y`` weighting each row by ``1/y²``
    (least relative squared error).  ``huber`` fits ``y`` with rows weighted by ``1/y`` and the
    Huber loss on the relative residual, by iteratively reweighted least squares: a row whose
    error is beyond ``HUBER_K`` robust standard deviations counts linearly, not squared, so the
    few requests that a step boundary or a burst sent far off their prediction do not pull
    every other prediction (MdAPE is a median: the typical row is what counts).  The bias is
    neither standardised nor penalised.
    """
    z = (x - mean) / scale
    t = np.log(np.maximum(y, _FLOOR_MS)) if learner.endswith("-log") else y
    reg = np.full(x.shape[1], alpha * x.shape[0])
    reg[0] = 0.0
    if learner == "ridge-rel":
        return mean, scale, _solve(z, t, 1.0 / np.maximum(y, _FLOOR_MS) ** 2, reg)
    if learner != "huber":
        return mean, scale, _solve(z, t, None, reg)
    base = 1.0 / np.maximum(y, _FLOOR_MS)
    rows = base
    weights = _solve(z, t, rows, reg)
    for _ in range(HUBER_ITERATIONS):
        rel = (t - z @ weights) * base  # relative residuals
        spread = 1.4826 * float(np.median(np.abs(rel - np.median(rel)))) + 1e-9  # robust std
        excess = np.abs(rel) / (HUBER_K * spread)
        rows = base / np.maximum(excess, 1.0)
        weights = _solve(z, t, rows, reg)
    return mean, scale, weights


def _solve(z: FloatArray, t: FloatArray, rows: FloatArray | None, reg: FloatArray) -> FloatArray:
    """Weighted ridge normal equations; row weights are normalised to mean 1 so ``reg`` weighs the same."""
    if rows is None:
        a = z.T @ z
        b = z.T @ t
    else:
        zw = z * (rows / rows.mean())[:, None]
        a = zw.T @ z
        b = zw.T @ t
    a[np.diag_indices_from(a)] += reg + 1e-9
    weights: FloatArray = np.linalg.solve(a, b).astype(np.float64)
    return weights


def _rescale(old: Fit, col: int, mean: FloatArray, scale: FloatArray) -> FloatArray:
    """Weights that give ``old``'s column ``col`` under a new standardisation (exact for a linear map)."""
    raw = old.weights[:, col] / old.scale  # weights on raw features
    bias = old.weights[0, col] - float(raw[1:] @ old.mean[1:])
    w = raw * scale
    w[0] = bias + float(raw[1:] @ mean[1:])
    return w


def mdape(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Median absolute percentage error, in percent (NaN when empty)."""
    errs = sorted(abs(p - a) / a for p, a in zip(predicted, actual, strict=True) if a > 0)
    if not errs:
        return math.nan
    return 100.0 * errs[len(errs) // 2]
