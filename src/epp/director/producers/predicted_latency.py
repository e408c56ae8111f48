"""``predicted-latency-producer``: predicted TTFT/TPOT and SLO headroom per candidate, learnt online."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Annotated, Any, ClassVar, Final

import numpy as np
import structlog
from pydantic import BeforeValidator, Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import (
    LATENCY_PREDICTION,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    LatencyPredictionInfo,
    prefix_matches,
)
from epp.director.latency.model import DEFAULT_LEARNER, MIN_SAMPLES, FloatArray, LatencyModel
from epp.director.latency.slo import SLO_TPOT_HEADER, SLO_TTFT_HEADER, slo_ms
from epp.director.latency.table import FeatureTable, Inflight, prefix_fractions
from epp.metrics import series
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, prompt_tokens
from epp.scheduling.api import SchedulingResult
from epp.units import parse_go_duration

log = structlog.get_logger(__name__)

_SSE_EVENT: Final = b"data:"

# Environment variables of GIE's sidecar client (gie-inventory §1.2) that still mean something.
ENV_MAX_SAMPLE_SIZE: Final = "LATENCY_MAX_SAMPLE_SIZE"  # rows kept per target (ring buffer)
ENV_FLUSH_INTERVAL: Final = "LATENCY_FLUSH_INTERVAL_SEC"  # seconds between trainings
ENV_LEARNER: Final = "EPP_LATENCY_LEARNER"  # ours: huber (default), ridge-log, ridge, ridge-rel
ENV_QUANTILE: Final = "EPP_LATENCY_QUANTILE"  # ours: which quantile of the latency is predicted
ENV_TRACE: Final = "EPP_LATENCY_TRACE"  # ours: append each TTFT row as a JSON line here (offline study)

DEFAULT_QUANTILE: Final = 0.9  # GIE's predictors estimate p90 TTFT / TPOT; see docs/latency-prediction.md


def _duration(value: object) -> object:
    """Go duration text (``"5m"``) to seconds; numbers pass through as seconds."""
    return parse_go_duration(value) if isinstance(value, str) else value


class PredictedLatencyParams(PluginParams):
    """GIE's parameters and defaults (gie-inventory §4.7); see docs/latency-prediction.md for each."""

    sampling_mean: float = 1000.0
    max_decode_token_samples_for_prediction: int = 0
    slo_buffer_factor: float = 1.0
    context_ttl: Annotated[float, BeforeValidator(_duration)] = Field(300.0, alias="contextTTL")
    streaming_mode: bool = False
    endpoint_role_label: str = ""
    predict_in_prepare_data: bool = True


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("invalid_env_var", name=name, value=raw, default=default)
        return default
    return value if value > 0 else default


def input_tokens(request: InferenceRequest) -> int:
    """GIE's simple estimate (``prompt_tokens``), at least 1 whenever there is a body."""
    n = prompt_tokens(request)
    return n if request.body is None else max(n, 1)


_INFO_FIELDS: Final = (
    "ttft_valid", "tpot_valid", "ttft_headroom", "tpot_headroom", "ttft", "tpot", "dispatched_request_count",
)  # fmt: skip


_FIELD_BY_FIELD: Final = 24  # candidates from which make_infos sets the objects field by field (measured)
_InfoColumns = tuple[
    Iterable[bool], Iterable[bool], Iterable[float], Iterable[float], Iterable[float], Iterable[float],
    Iterable[int],
]  # fmt: skip


def _info_factories() -> tuple[
    Callable[[bool, bool, float, float, float, float, int], LatencyPredictionInfo],
    Callable[[int, _InfoColumns], list[LatencyPredictionInfo]],
]:
    """``LatencyPredictionInfo(...)`` one at a time (``make_info``) and a whole request's at once
    (``make_infos``, field by field).  The frozen dataclass's ``__init__`` goes through
    ``object.__setattr__`` per field; here each slot is set by its descriptor, and
    ``make_infos`` calls the descriptors from ``map`` (C), with no Python frame per object:
    3x the dataclass's speed for 100 candidates (below ``_FIELD_BY_FIELD`` candidates the
    seven passes cost more than they save, and it calls ``make`` per object).  One request
    builds one per candidate, so this is the largest part of PrepareData.  Checked against
    the dataclass's fields at import: a new field fails loudly, not silently.
    """
    names = tuple(f.name for f in dataclasses.fields(LatencyPredictionInfo))
    if names != _INFO_FIELDS:
        raise TypeError(f"LatencyPredictionInfo fields changed: {names}")
    setters = tuple(LatencyPredictionInfo.__dict__[n].__set__ for n in names)
    s0, s1, s2, s3, s4, s5, s6 = setters
    new = object.__new__
    cls = LatencyPredictionInfo

    def make(a: bool, b: bool, c: float, d: float, e: float, f: float, g: int) -> LatencyPredictionInfo:
        o: LatencyPredictionInfo = new(cls)
        s0(o, a)
        s1(o, b)
        s2(o, c)
        s3(o, d)
        s4(o, e)
        s5(o, f)
        s6(o, g)
        return o

    def make_many(n: int, columns: _InfoColumns) -> list[LatencyPredictionInfo]:
        if n < _FIELD_BY_FIELD:
            return list(map(make, *columns))
        objs: list[LatencyPredictionInfo] = list(map(new, repeat(cls, n)))
        for setter, values in zip(setters, columns, strict=True):
            deque(map(setter, objs, values), maxlen=0)
        return objs

    return make, make_many


make_info, make_infos = _info_factories()


class _Request:
    """One request's prediction context, from PrepareData to the end of its response."""

    __slots__ = (
        "counter",
        "endpoints",
        "first_seen",
        "last_sample_at",
        "last_sample_tokens",
        "next_sample",
        "predictions",
        "prefill",
        "row",
        "samples",
        "slo_tpot",
        "slo_ttft",
        "step",
        "target",
        "target_tpot",
        "target_ttft",
        "tokens",
        "tokens_in",
        "tpot_valid",
        "ttft_valid",
        "x",
    )

    def __init__(self) -> None:
        self.endpoints: Sequence[Endpoint] = ()
        self.x: FloatArray | None = None
        self.predictions: FloatArray | None = None
        self.ttft_valid = False
        self.tpot_valid = False
        self.slo_ttft = 0.0
        self.slo_tpot = 0.0
        self.tokens_in = 0
        self.row: FloatArray | None = None  # the chosen endpoint's features
        self.target = ""  # the chosen endpoint's name
        self.target_ttft = 0.0
        self.target_tpot = 0.0
        self.counter: Inflight | None = None
        self.prefill = 0.0  # what this request added to its counter's queued prefill
        self.step = 0  # the engine step (StepClock number) its prefill was queued for
        self.first_seen = False
        self.tokens = 0  # SSE events seen (≈ output tokens when streaming)
        self.last_sample_at = 0.0
        self.last_sample_tokens = 0
        self.next_sample = 0
        self.samples = 0


class PredictedLatencyProducer(PluginBase):
    """Predict TTFT and TPOT for every candidate.  Type ``predicted-latency-producer``.

    PrepareData: builds one feature row per candidate (KV-cache use, waiting and running
    requests from the scrape; input tokens; prefix match fraction from ``PREFIX_MATCH``, or
    from the engines' KV events where a precise-prefix-cache-scorer runs (``READS``);
    requests and tokens this EPP dispatched there and has not seen finish), predicts both
    targets with one matrix product and writes ``LatencyPredictionInfo`` (ms; headroom =
    SLO x ``sloBufferFactor`` - prediction, the SLO from ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``,
    0 when absent) under ``LATENCY_PREDICTION``.  A dimension is valid once its model was
    trained on ``MIN_SAMPLES`` rows; predictions are the p90 (``EPP_LATENCY_QUANTILE``).
    PreRequest: counts the request as dispatched to the primary target and records the
    predicted-latency metrics.  ResponseBody: the first chunk of a streamed response is the
    actual TTFT (a training row and the SLO check); further chunks are counted as tokens and,
    with ``streamingMode``, TPOT rows are sampled at exponential intervals of mean
    ``samplingMean`` tokens (at most ``maxDecodeTokenSamplesForPrediction`` per request when
    > 0).  ResponseComplete: the request's mean TPOT (usage or counted tokens) becomes a
    row; the dispatched counters are released.  Training runs in a worker thread every
    ``LATENCY_FLUSH_INTERVAL_SEC`` (1 s) when rows arrived (Lifecycle).
    Produces ``LATENCY_PREDICTION``; consumes ``PREFIX_MATCH``; reads ``PRECISE_PREFIX_MATCH``.
    """

    TYPE: ClassVar[str] = "predicted-latency-producer"
    PARAMS: ClassVar[type[PluginParams]] = PredictedLatencyParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({LATENCY_PREDICTION})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})

    def __init__(self, name: str, params: PredictedLatencyParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.params = params
        capacity = int(_env_number(ENV_MAX_SAMPLE_SIZE, 1000))
        self.train_interval = _env_number(ENV_FLUSH_INTERVAL, 1.0)
        learner = os.environ.get(ENV_LEARNER, "") or DEFAULT_LEARNER
        quantile = _env_number(ENV_QUANTILE, DEFAULT_QUANTILE)
        self.model = LatencyModel(capacity=capacity, learner=learner, quantile=min(quantile, 0.99))
        self.table = FeatureTable()  # per-endpoint feature rows and the in-flight counters they read
        self.clock: Callable[[], float] = time.monotonic  # tests pin it
        self._key: StateKey[_Request] = StateKey(f"{name}/{self.TYPE}")
        self._task: asyncio.Task[None] | None = None
        self.rng = random.Random()
        trace = os.environ.get(ENV_TRACE, "")
        self._trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115 (lives with the plugin)

    # Lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._train_loop(), name="latency-trainer")

    async def stop(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _train_loop(self) -> None:
        while True:
            await asyncio.sleep(self.train_interval)
            if self.model.pending:
                try:
                    await self.train()
                except Exception:  # a bad batch must not stop learning
                    log.warning("latency_training_failed", exc_info=True)

    async def train(self) -> None:
        """One training off the event loop (a worker thread); the new model is swapped in."""
        await asyncio.to_thread(self.model.train)

    # DataProducer ---------------------------------------------------------------------
    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        self.prepare(state, request, endpoints)

    def prepare(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        """The synchronous body of ``prepare_request_data`` (benchmarks call it)."""
        ctx = _Request()
        state.put(self._key, ctx)
        ctx.slo_ttft = slo_ms(request.headers, SLO_TTFT_HEADER)
        ctx.slo_tpot = slo_ms(request.headers, SLO_TPOT_HEADER)
        ctx.tokens_in = input_tokens(request)
        n = len(endpoints)
        if n == 0:
            return
        ctx.endpoints = endpoints
        fraction = prefix_fractions(prefix_matches(state), endpoints)
        x = ctx.x = self.table.assemble(endpoints, float(ctx.tokens_in), fraction, self.clock())
        if not self.params.predict_in_prepare_data:
            return
        t0 = time.perf_counter()
        fit = self.model.fit
        if fit is None:
            return
        pred = fit.predict(x)
        elapsed = time.perf_counter() - t0
        ctx.predictions = pred
        ctx.ttft_valid = fit.samples[0] >= MIN_SAMPLES
        ctx.tpot_valid = fit.samples[1] >= MIN_SAMPLES
        labels = (request.incoming_model, request.target_model)
        series.TTFT_PREDICTION_DURATION.labels(*labels).observe(elapsed)
        series.TPOT_PREDICTION_DURATION.labels(*labels).observe(elapsed)
        gauge = series.INFERENCE_REQUEST_METRIC
        gauge.labels(*labels, "ttft_prediction_duration").set(elapsed)
        gauge.labels(*labels, "tpot_prediction_duration").set(elapsed)
        factor = self.params.slo_buffer_factor
        slo = np.array((ctx.slo_ttft * factor, ctx.slo_tpot * factor))
        ttfts, tpots = pred.T.tolist()
        head_ttft, head_tpot = (slo - pred).T.tolist()  # the same subtraction as in Python floats
        dispatched = x[:, 5].astype(np.int64).tolist()  # inflight_requests: this EPP's counts
        columns = (
            repeat(ctx.ttft_valid),
            repeat(ctx.tpot_valid),
            head_ttft,
            head_tpot,
            ttfts,
            tpots,
            dispatched,
        )
        infos = make_infos(n, columns)
        values: dict[Any, LatencyPredictionInfo] = dict(zip(endpoints, infos, strict=True))
        state.set_attributes(LATENCY_PREDICTION, values)

    prepare_request_data_now = prepare  # never waits: the director calls it without a coroutine

    # PreRequest -------------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        ctx = state.get(self._key)
        if ctx is None:
            return
        run = result.profile_results.get(result.primary_profile_name)
        if run is None or not run.target_endpoints:
            return
        target = run.target_endpoints[0]
        name = target.metadata.name
        counter = self.table.counter(name)
        counter.requests += 1
        counter.tokens += ctx.tokens_in
        ctx.target = name
        ctx.counter = counter
        try:
            i = ctx.endpoints.index(target)
        except ValueError:
            i = -1
        # queued prefill: the uncached tokens (prefix match on the target) until the first token
        ctx.prefill = float(ctx.x[i, 8]) * 1000.0 if ctx.x is not None and i >= 0 else float(ctx.tokens_in)
        counter.prefill += ctx.prefill
        ctx.step = counter.steps.dispatch(ctx.prefill, self.clock())
        self.table.touch(name)
        if ctx.x is None or i < 0:
            return
        ctx.row = ctx.x[i].copy()
        pred = ctx.predictions
        if pred is None:
            return
        ctx.target_ttft, ctx.target_tpot = float(pred[i, 0]), float(pred[i, 1])
        labels = (request.incoming_model, request.target_model)
        gauge = series.INFERENCE_REQUEST_METRIC
        if ctx.ttft_valid:
            series.REQUEST_PREDICTED_TTFT.labels(*labels).observe(ctx.target_ttft / 1000.0)
            gauge.labels(*labels, "predicted_ttft").set(ctx.target_ttft / 1000.0)
        if ctx.tpot_valid:
            series.REQUEST_PREDICTED_TPOT.labels(*labels).observe(ctx.target_tpot / 1000.0)
            gauge.labels(*labels, "predicted_tpot").set(ctx.target_tpot / 1000.0)

    # response side ------------------------------------------------------------------------
    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        """Tell the client what was predicted for the chosen endpoint (ours; docs/latency-prediction.md)."""
        ctx = state.get(self._key)
        if ctx is None or ctx.row is None or ctx.predictions is None:
            return
        if ctx.ttft_valid:
            response.headers["x-epp-predicted-ttft-ms"] = f"{ctx.target_ttft:.3f}"
        if ctx.tpot_valid:
            response.headers["x-epp-predicted-tpot-ms"] = f"{ctx.target_tpot:.3f}"

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None:
        ctx = state.get(self._key)
        if ctx is None or not chunk:
            return
        if not ctx.first_seen:
            ctx.first_seen = True
            self._first_chunk(ctx, request, response)
        if not response.streaming:
            return
        ctx.tokens += chunk.count(_SSE_EVENT)
        if self.params.streaming_mode and ctx.row is not None and ctx.tokens >= ctx.next_sample:
            now = self.clock()
            cap = self.params.max_decode_token_samples_for_prediction
            delta = ctx.tokens - ctx.last_sample_tokens
            if delta > 0 and ctx.last_sample_at and (cap <= 0 or ctx.samples < cap):
                self.model.add_tpot(ctx.row, 1000.0 * (now - ctx.last_sample_at) / delta)
                ctx.samples += 1
            ctx.last_sample_at, ctx.last_sample_tokens = now, ctx.tokens
            gap = max(1, round(self.rng.expovariate(1.0 / max(self.params.sampling_mean, 1.0))))
            ctx.next_sample = ctx.tokens + gap

    def _prefill_done(self, ctx: _Request, first_token_at: float = 0.0) -> None:
        """The request's prompt is computed (or abandoned): it no longer waits ahead of others.

        Once per request: a first token (``first_token_at``) also ends the engine step it was in.
        """
        counter = ctx.counter
        if counter is not None and ctx.step >= 0:
            if ctx.prefill:
                counter.prefill = max(counter.prefill - ctx.prefill, 0.0)
            if first_token_at:
                counter.steps.first_token(ctx.step, ctx.prefill, first_token_at)
            else:
                counter.steps.cancel(ctx.step, ctx.prefill)
            self.table.touch(ctx.target)
        ctx.prefill = 0.0
        ctx.step = -1

    def _first_chunk(self, ctx: _Request, request: InferenceRequest, response: ResponseInfo) -> None:
        first = response.first_chunk_at or self.clock()
        self._prefill_done(ctx, first if response.streaming else 0.0)
        ctx.last_sample_at = first
        ctx.last_sample_tokens = 0
        if not response.streaming or not request.received_at:
            return  # an unstreamed body's first byte is its last: not a TTFT
        ttft_ms = 1000.0 * (first - request.received_at)
        labels = (request.incoming_model, request.target_model)
        if ctx.row is not None:
            self.model.add_ttft(ctx.row, ttft_ms)
            if self._trace is not None:
                self._trace.write(json.dumps({"at": first, "endpoint": ctx.target, "x": ctx.row.tolist(),
                                              "ttft_ms": ttft_ms}) + "\n")  # fmt: skip
        series.INFERENCE_REQUEST_METRIC.labels(*labels, "ttft").set(ttft_ms / 1000.0)
        if ctx.predictions is not None and ctx.ttft_valid and ttft_ms > 0:
            series.LATENCY_PREDICTION_ERROR.labels(*labels, "ttft").observe(
                abs(ctx.target_ttft - ttft_ms) / ttft_ms
            )
        if ctx.slo_ttft > 0 and ttft_ms > ctx.slo_ttft:
            series.SLO_VIOLATION_TOTAL.labels(*labels, "ttft").inc()
            series.INFERENCE_REQUEST_METRIC.labels(*labels, "ttft_slo_violation").set(1)

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        ctx = state.get(self._key)
        if ctx is None:
            return
        self._prefill_done(ctx)
        counter, ctx.counter = ctx.counter, None
        if counter is not None:  # released exactly once
            counter.requests = max(counter.requests - 1, 0)
            counter.tokens = max(counter.tokens - ctx.tokens_in, 0)
            self.table.touch(ctx.target)
        if not response.end_of_stream or not response.streaming or not response.first_chunk_at:
            return
        usage = response.usage
        tokens = usage.completion_tokens if usage is not None and usage.completion_tokens else ctx.tokens
        end = response.completed_at or self.clock()
        if tokens < 2 or end <= response.first_chunk_at:
            return
        tpot_ms = 1000.0 * (end - response.first_chunk_at) / (tokens - 1)
        labels = (request.incoming_model, request.target_model)
        if ctx.row is not None:
            self.model.add_tpot(ctx.row, tpot_ms)
        series.INFERENCE_REQUEST_METRIC.labels(*labels, "tpot").set(tpot_ms / 1000.0)
        if ctx.predictions is not None and ctx.tpot_valid:
            error = abs(ctx.target_tpot - tpot_ms) / tpot_ms
            series.LATENCY_PREDICTION_ERROR.labels(*labels, "tpot").observe(error)
        if ctx.slo_tpot > 0 and tpot_ms > ctx.slo_tpot:
            series.SLO_VIOLATION_TOTAL.labels(*labels, "tpot").inc()
            series.INFERENCE_REQUEST_METRIC.labels(*labels, "tpot_slo_violation").set(1)

    # read API / EndpointObserver ---------------------------------------------------------
    def dispatched(self, endpoint: Endpoint) -> int:
        """Requests this EPP sent to ``endpoint`` and has not seen finish."""
        c = self.table.counters.get(endpoint.metadata.name)
        return 0 if c is None else c.requests

    def endpoint_added(self, endpoint: Endpoint) -> None:
        pass

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.table.remove(endpoint)
