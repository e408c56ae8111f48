"""predicted-latency-producer: features, headroom, dispatched counters, training rows, metrics."""

from __future__ import annotations

import time
from typing import Any

import pytest

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.attributes import (
    LATENCY_PREDICTION,
    PRECISE_PREFIX_MATCH,
    PREFIX_MATCH,
    LatencyPredictionInfo,
    PrefixMatchInfo,
)
from epp.director.api import DataProducer, PreRequest, ResponseBodyProcessor, ResponseCompleteProcessor
from epp.director.latency.model import FEATURE_NAMES, MIN_SAMPLES
from epp.director.producers.predicted_latency import PredictedLatencyProducer, make_info
from epp.metrics import series
from epp.plugin.base import Lifecycle
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, Usage
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.testing.plugins import build
from epp.testing.waiting import until
from tests.scheduling.builders import endpoint


def req(size: int = 4000, /, **headers: str) -> InferenceRequest:
    r = InferenceRequest(
        request_id="r",
        headers=dict(headers),
        incoming_model="m",
        target_model="m",
        request_size_bytes=size,
        received_at=time.monotonic(),
    )
    return r


def result(ep: object) -> SchedulingResult:
    return SchedulingResult({"default": ProfileRunResult((ep,))}, "default")  # type: ignore[arg-type]


def serve(p: PredictedLatencyProducer, eps: list[Any], r: InferenceRequest, target: int, ttft: float, tpot: float,
          tokens: int = 11) -> CycleState:  # fmt: skip
    """One request through every hook: prepare, pre-request, first chunk at ``ttft`` s, end."""
    state = CycleState()
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[target]))
    resp = ResponseInfo(request_id="r", streaming=True)
    p.response_header(state, r, resp, eps[target])
    resp.first_chunk_at = r.received_at + ttft
    p.response_body(state, r, resp, b'data: {"x": 1}\n\n', eps[target])
    resp.end_of_stream = True
    resp.usage = Usage(prompt_tokens=10, completion_tokens=tokens, total_tokens=10 + tokens)
    resp.completed_at = resp.first_chunk_at + tpot * (tokens - 1)
    p.response_complete(state, r, resp, eps[target])
    return state


def test_params_defaults_and_protocols() -> None:
    p = build(PredictedLatencyProducer)
    prm = p.params
    assert (prm.sampling_mean, prm.max_decode_token_samples_for_prediction, prm.slo_buffer_factor) == (
        1000,
        0,
        1,
    )
    assert (prm.context_ttl, prm.streaming_mode, prm.endpoint_role_label, prm.predict_in_prepare_data) == (
        300.0, False, "", True,
    )  # fmt: skip
    assert build(PredictedLatencyProducer, contextTTL="90s", samplingMean=50).params.context_ttl == 90.0
    for proto in (DataProducer, PreRequest, ResponseBodyProcessor, ResponseCompleteProcessor, Lifecycle):
        assert isinstance(p, proto)


def test_no_prediction_before_training_then_valid_with_headroom() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0, queue=0, running=2, kv=0.1), endpoint(1, queue=4, running=10, kv=0.6)]
    state = CycleState()
    p.prepare(state, req(), eps)
    assert not state.attributes(LATENCY_PREDICTION)  # untrained: nothing written
    for k in range(3 * MIN_SAMPLES):
        serve(p, eps, req(), k % 2, ttft=0.05 + 0.1 * (k % 2), tpot=0.01 + 0.01 * (k % 2))
    assert p.model.counts() == (3 * MIN_SAMPLES, 3 * MIN_SAMPLES)
    assert p.model.train() is not None
    state = CycleState()
    p.prepare(state, req(**{"x-slo-ttft-ms": "100", "x-slo-tpot-ms": "15"}), eps)
    infos = state.attributes(LATENCY_PREDICTION)
    a, b = infos[eps[0]], infos[eps[1]]
    assert a.ttft_valid and a.tpot_valid
    assert a.ttft == pytest.approx(50, rel=0.05) and b.ttft == pytest.approx(150, rel=0.05)
    assert a.tpot == pytest.approx(10, rel=0.05) and b.tpot == pytest.approx(20, rel=0.05)
    assert a.ttft_headroom == pytest.approx(100 - a.ttft) and b.tpot_headroom == pytest.approx(15 - b.tpot)
    assert a.dispatched_request_count == 0


def test_slo_buffer_factor_scales_the_slo() -> None:
    p = build(PredictedLatencyProducer, sloBufferFactor=0.5)
    eps = [endpoint(0)]
    for _ in range(MIN_SAMPLES):
        serve(p, eps, req(), 0, ttft=0.04, tpot=0.01)
    p.model.train()
    state = CycleState()
    p.prepare(state, req(**{"x-slo-ttft-ms": "100"}), eps)
    info = state.attributes(LATENCY_PREDICTION)[eps[0]]
    assert info.ttft_headroom == pytest.approx(50 - info.ttft)
    assert info.tpot_headroom == pytest.approx(-info.tpot)  # no TPOT SLO: 0, as GIE


def test_dispatched_counters_follow_the_request() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0), endpoint(1)]
    state = CycleState()
    r = req()
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[1]))
    assert (p.dispatched(eps[0]), p.dispatched(eps[1])) == (0, 1)
    resp = ResponseInfo(request_id="r")
    p.response_complete(state, r, resp, eps[1])
    p.response_complete(state, r, resp, eps[1])  # released once
    assert p.dispatched(eps[1]) == 0


def test_features_read_prefix_match_and_inflight() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0, kv=0.5, queue=3, running=7)]
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[0]: PrefixMatchInfo(3, 4, 16)})
    r = req(8000)
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[0]))
    state2 = CycleState()
    state2.set_attributes(PREFIX_MATCH, {eps[0]: PrefixMatchInfo(3, 4, 16)})
    p.prepare(state2, req(8000), eps)
    ctx = state2.get(p._key)
    assert ctx is not None and ctx.x is not None
    row = ctx.x[0]
    # bias, kv, kv², waiting, running, inflight req, inflight tok/1000, input/1000, uncached/1000, prefix
    assert row[:10].tolist() == pytest.approx([1, 0.5, 0.25, 3, 7, 1, 2.0, 2.0, 0.5, 0.75])


def test_queued_prefill_is_released_at_the_first_token() -> None:
    """The work-ahead feature counts uncached prompt tokens until their first token comes back."""
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0), endpoint(1)]
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[1]: PrefixMatchInfo(1, 4, 16)})
    r = req(8000)  # 2000 tokens, a quarter of them cached on eps[1]
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[1]))

    def work_ahead(ep: int, size: int = 4000) -> float:
        s = CycleState()
        p.prepare(s, req(size), eps)
        ctx = s.get(p._key)
        assert ctx is not None and ctx.x is not None
        return float(ctx.x[ep, 12] - ctx.x[ep, 8])  # work minus this request's own uncached tokens

    assert work_ahead(1) == pytest.approx(1.5)  # 1500 uncached tokens queued ahead, in thousands
    assert work_ahead(0) == 0.0
    resp = ResponseInfo(request_id="r", streaming=True)
    resp.first_chunk_at = r.received_at + 0.05
    p.response_body(state, r, resp, b'data: {"x": 1}\n\n', eps[1])
    assert work_ahead(1) == 0.0  # prefill done, still in flight
    assert p.dispatched(eps[1]) == 1
    p.response_complete(state, r, resp, eps[1])
    assert work_ahead(1) == 0.0 and p.dispatched(eps[1]) == 0


def test_queued_prefill_is_released_when_no_token_comes() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0)]
    state = CycleState()
    r = req(4000)
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[0]))
    p.response_complete(state, r, ResponseInfo(request_id="r"), eps[0])  # failed before any body
    s = CycleState()
    p.prepare(s, req(4000), eps)
    ctx = s.get(p._key)
    assert ctx is not None and ctx.x is not None
    assert ctx.x[0, 12] == pytest.approx(ctx.x[0, 8])


def test_slo_violation_and_error_metrics() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0)]
    for _ in range(MIN_SAMPLES):
        serve(p, eps, req(), 0, ttft=0.02, tpot=0.005)
    p.model.train()
    viol = series.SLO_VIOLATION_TOTAL.labels("m", "m", "ttft")
    err = series.LATENCY_PREDICTION_ERROR.labels("m", "m", "ttft")
    before_v, before_e = viol.value, sum(err.counts)
    state = serve(p, eps, req(**{"x-slo-ttft-ms": "5"}), 0, ttft=0.02, tpot=0.005)
    assert viol.value == before_v + 1
    assert sum(err.counts) == before_e + 1
    ctx = state.get(p._key)
    assert ctx is not None and ctx.target_ttft == pytest.approx(20, rel=0.05)
    gauge = series.INFERENCE_REQUEST_METRIC
    assert gauge.labels("m", "m", "ttft").value == pytest.approx(0.02)
    assert gauge.labels("m", "m", "predicted_ttft").value == pytest.approx(0.02, rel=0.05)
    assert gauge.labels("m", "m", "ttft_prediction_duration").value > 0


def test_unstreamed_responses_are_not_ttft_samples() -> None:
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0)]
    state = CycleState()
    r = req()
    p.prepare(state, r, eps)
    p.pre_request(state, r, result(eps[0]))
    resp = ResponseInfo(request_id="r", streaming=False, first_chunk_at=time.monotonic())
    p.response_body(state, r, resp, b"{}", eps[0])
    resp.end_of_stream = True
    p.response_complete(state, r, resp, eps[0])
    assert p.model.counts() == (0, 0)


async def test_lifecycle_trains_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATENCY_FLUSH_INTERVAL_SEC", "0.01")
    p = build(PredictedLatencyProducer)
    assert p.train_interval == 0.01
    eps = [endpoint(0)]
    for _ in range(MIN_SAMPLES):
        serve(p, eps, req(), 0, ttft=0.02, tpot=0.005)
    await p.start()
    try:
        await until(lambda: p.model.fit is not None, timeout=5, what="a background training")
    finally:
        await p.stop()


def test_make_info_equals_the_dataclass() -> None:

    args = (True, False, 1.5, -2.0, 30.0, 4.0, 3)
    assert make_info(*args) == LatencyPredictionInfo(*args)


def test_latency_scorer_alone_auto_creates_the_producer() -> None:
    """LatencyPredictionInfoKey's default producer is added when only a consumer is configured (§3.2)."""
    text = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: latency-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: latency-scorer\n"
    )
    components = build_config(load_config(text), default_registry())
    types = [p.typed_name.type for p in components.producers]
    assert types == ["approx-prefix-cache-producer", "predicted-latency-producer"]


def test_a_precise_scorer_runs_first_and_its_match_is_the_prefix_feature() -> None:
    """With a precise-prefix-cache-scorer configured (listed after it here), the producer runs after
    it and reads the engines' reported match instead of the approximate index's guess."""
    text = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: predicted-latency-producer\n- type: precise-prefix-cache-scorer\n"
        "  parameters: {}\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: precise-prefix-cache-scorer\n"
    )
    components = build_config(load_config(text), default_registry())
    types = [p.typed_name.type for p in components.producers]
    assert types == [
        "approx-prefix-cache-producer",
        "precise-prefix-cache-scorer",
        "predicted-latency-producer",
    ]

    p = build(PredictedLatencyProducer)
    eps = [endpoint(0), endpoint(1)]
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {eps[0]: PrefixMatchInfo(3, 4, 16)})  # a stale guess
    state.set_attributes(
        PRECISE_PREFIX_MATCH, {eps[0]: PrefixMatchInfo(0, 4, 16), eps[1]: PrefixMatchInfo(1, 4, 16)}
    )
    p.prepare(state, req(8000), eps)
    ctx = state.get(p._key)
    assert ctx is not None and ctx.x is not None
    prefix = FEATURE_NAMES.index("prefix_fraction")
    assert ctx.x[:, prefix].tolist() == [0.0, 0.25]


def test_step_columns_follow_dispatches_and_first_tokens() -> None:
    """A request sent to an idle endpoint runs at once (the running step); the next one waits behind it
    (queued) until the first one's first token, when it becomes the running step."""
    p = build(PredictedLatencyProducer)
    eps = [endpoint(0), endpoint(1)]
    cur, ahead, elapsed, own = (FEATURE_NAMES.index(n) for n in ("step_current_k", "step_ahead_k",
                                                                  "step_elapsed_s", "uncached_tokens_k"))  # fmt: skip

    def steps(ep: int = 0) -> tuple[float, float, float]:
        s = CycleState()
        p.prepare(s, req(400), eps)
        ctx = s.get(p._key)
        assert ctx is not None and ctx.x is not None
        row = ctx.x[ep]
        return float(row[cur]), float(row[ahead] - row[own]), float(row[elapsed])

    def send(size: int) -> tuple[CycleState, InferenceRequest]:
        s, r = CycleState(), req(size)
        p.prepare(s, r, eps)
        p.pre_request(s, r, result(eps[0]))
        return s, r

    sa, a = send(4000)  # 1000 tokens
    running, queued, since = steps()
    assert (running, queued) == pytest.approx((1.0, 0.0)) and since >= 0.0
    sb, b = send(2000)  # 500 tokens, behind a
    assert steps()[:2] == pytest.approx((1.0, 0.5))
    assert steps(1) == (0.0, 0.0, 0.0)  # the other endpoint is idle
    resp = ResponseInfo(request_id="a", streaming=True)
    resp.first_chunk_at = time.monotonic()
    p.response_body(sa, a, resp, b'data: {"x": 1}\n\n', eps[0])  # a's step ended: b runs now
    assert steps()[:2] == pytest.approx((0.5, 0.0))
    p.response_complete(sb, b, ResponseInfo(request_id="b"), eps[0])  # b failed without a token
    assert steps() == (0.0, 0.0, 0.0)
