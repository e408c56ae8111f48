"""The in-process latency predictor: prediction cost, training CPU, accuracy and goodput on the simulator.

    python -m bench.latency [--quick] [--learners huber,ridge-log,ridge,ridge-rel] [--no-accuracy]
        [--no-goodput] [--accuracy-routers predictor,predictor-gie-least] [--trace /tmp/t.jsonl]

1. **Prediction cost** (in process): ``predicted-latency-producer``'s PrepareData (feature
   matrix, one matrix product, a ``LatencyPredictionInfo`` per candidate) and the bare model
   product, at 10/100/1000 endpoints; wall-clock p50/p99 in µs.  Twice: with nothing changing
   between requests, and with traffic (``prepare_data_traffic_us``): before each request, the
   previous one dispatched, the oldest of 8 in flight answered (first token, completion), a
   tenth of the endpoints rescraped (50 ms scrapes at 200 req/s) and a prefix match on a few.
   Each also as a ratio to the model product of the same run (``prepare_over_product``).
2. **Training CPU** (in process): thread CPU of one training on full rings (1000 rows per
   target, the default ``LATENCY_MAX_SAMPLE_SIZE``) and of appending one row; the share of one
   core at 100 requests/s (two rows per request, one training per second).
3. **Accuracy** on a simulated fleet through Envoy (``epp-sim``, 4 replicas, real time): the
   predictor config (config/examples/predicted-latency.yaml), streamed chat with SLO headers,
   Poisson arrivals at increasing rates on one EPP (the model keeps learning across levels).
   Each response carries the EPP's prediction for the chosen replica
   (``x-epp-predicted-ttft-ms``); the client measures TTFT (send to first content event).
   Per level, the MdAPE (and the median signed error) of TTFT after the level's first quarter
   (warm-up); per learner (``EPP_LATENCY_LEARNER``), predicting the median
   (``EPP_LATENCY_QUANTILE=0.5``); per router of ``--accuracy-routers`` (the predictor config,
   GIE's ``least`` variant: it packs load, the hardest case).  ``--trace F`` records the EPP's
   training rows (``EPP_LATENCY_TRACE``) and the client's requests next to them, for
   ``python -m bench.latency_replay``.
4. **Goodput**: half the requests (a seeded draw) carry a TTFT SLO; per rate, how many of them
   met it, TTFT percentiles and output tokens, for the default config (config/default.yaml),
   the predictor config (p90 model, ``most``), GIE's predictor config unchanged
   (bench/configs/predicted-latency-least.yaml, full mode) and Envoy round robin, each on a
   fresh fleet with the same arrivals, after an unmeasured warm-up level at half the first
   rate.  The goal is judged at the first rate at which the default config meets the SLO
   for at most 1/1.3 of the SLO requests: 1.3x its goodput there, while finishing at least
   0.97x its requests and output tokens per second in each window from that rate up.
   ``--routers`` also takes EPP config files; ``--goodput-rates 12,12,12,12,12,12`` holds one
   rate (a steady-load run: each window's backlog is reported, ``in_flight_at_end``).

Writes bench/results/latency.json (``--result-name``; cost alone: ``--no-accuracy --no-goodput
--result-name latency-cost``, which the report prefers when it is the newer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench.common import ROOT, PeerRouter, PeerSpec, log, peer_installed, read_result, write_result
from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.datalayer.attributes import PREFIX_MATCH, PrefixMatchInfo
from epp.director.latency.model import DEFAULT_LEARNER, LEARNERS, N_FEATURES, LatencyModel
from epp.director.producers.predicted_latency import PredictedLatencyParams, PredictedLatencyProducer
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

MODEL = "mock-model"
SEEDS = {"sim": 1, "workload": 42, "arrivals": 7, "micro": 3}
ENDPOINTS = (10, 100, 1000)
GOALS = {"predict_us_100_endpoints": 50.0}
PREDICTOR_CONFIG = ROOT / "config" / "examples" / "predicted-latency.yaml"
DEFAULT_CONFIG = ROOT / "config" / "default.yaml"
MAX_SCORE_CONFIG = ROOT / "bench" / "configs" / "predicted-latency-max-score.yaml"
GIE_LEAST_CONFIG = ROOT / "bench" / "configs" / "predicted-latency-least.yaml"  # GIE's strategy default
MIXED_SLO_CONFIG = (
    ROOT / "config" / "examples" / "predicted-latency-mixed-slo.yaml"
)  # + SLO reserve, max-score
MIXED_SLO_PACK_CONFIG = ROOT / "bench" / "configs" / "predicted-latency-mixed-slo-pack.yaml"
SLO_TTFT_MS = 400.0
SLO_TPOT_MS = 60.0
REPLICAS = 4
# KV cache of 4000 blocks x 16 = 64k tokens per replica: at the top rate it fills and requests queue.
SIM_ARGS = ("--seed", str(SEEDS["sim"]), "--num-gpu-blocks", "4000",
            "--model", MODEL, "--max-model-len", "32768")  # fmt: skip


class _Handle:
    def plugin(self, name: str) -> Any:
        raise KeyError(name)

    def plugins(self) -> list[Any]:
        return []


# --- 1. prediction cost -------------------------------------------------------------------------
TRAFFIC_IN_FLIGHT = 8  # requests between dispatch and answer in the traffic cells
TRAFFIC_RESCRAPED = 0.1  # share of the endpoints with a new reading between two requests
TRAFFIC_PREFIX_HITS = 0.05  # share of the endpoints with a prefix match


def _metrics(rng: random.Random) -> Metrics:
    return Metrics(
        waiting_queue_size=rng.randrange(0, 20),
        kv_cache_usage_percent=rng.random(),
        running_requests_size=rng.randrange(0, 50),
        update_time=time.monotonic(),
    )


def _endpoints(n: int, rng: random.Random) -> tuple[Endpoint, ...]:
    """A datastore's snapshot: one tuple, handed to every request."""
    return tuple(
        Endpoint(
            EndpointMetadata(name=f"bench/pod-{i}-rank-0", address=f"10.0.{i // 256}.{i % 256}", port=8000),
            _metrics(rng),
        )
        for i in range(n)
    )


def _trained_producer(rng: np.random.Generator) -> PredictedLatencyProducer:
    p = PredictedLatencyProducer("p", PredictedLatencyParams.model_validate({}), _Handle())
    for _ in range(1000):
        x = rng.uniform(0, 5, N_FEATURES)
        x[0] = 1.0
        p.model.add_ttft(x, float(20 + 10 * x[1:].sum()))
        p.model.add_tpot(x, float(5 + x[1:].sum()))
    assert p.model.train() is not None
    return p


def _stats_us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50": round(1e6 * s[len(s) // 2], 2),
        "p99": round(1e6 * s[min(len(s) - 1, int(len(s) * 0.99))], 2),
    }


def bench_prediction(iterations: int) -> list[dict[str, Any]]:
    rng = random.Random(SEEDS["micro"])
    producer = _trained_producer(np.random.default_rng(SEEDS["micro"]))
    fit = producer.model.fit
    assert fit is not None
    cells = []
    for n in ENDPOINTS:
        eps = _endpoints(n, rng)
        req = InferenceRequest(request_id="b", headers={"x-slo-ttft-ms": "300"}, request_size_bytes=8000)
        state = CycleState()
        producer.prepare(state, req, eps)
        ctx = state.get(producer._key)
        assert ctx is not None
        assert ctx.x is not None
        x = ctx.x
        prep, pred = [], []
        for _ in range(iterations):
            state = CycleState()
            t0 = time.perf_counter()
            producer.prepare(state, req, eps)
            t1 = time.perf_counter()
            fit.predict(x)
            t2 = time.perf_counter()
            prep.append(t1 - t0)
            pred.append(t2 - t1)
        traffic = _prepare_with_traffic(producer, eps, iterations, rng)
        stats = {"prepare_data_us": _stats_us(prep), "predict_us": _stats_us(pred),
                 "prepare_data_traffic_us": _stats_us(traffic)}  # fmt: skip
        product = stats["predict_us"]["p50"]  # the baseline of the same run: machine speed cancels out
        cell: dict[str, Any] = {"endpoints": n, **stats}
        cell["prepare_over_product"] = round(stats["prepare_data_us"]["p50"] / product, 1)
        cell["traffic_over_product"] = round(stats["prepare_data_traffic_us"]["p50"] / product, 1)
        cells.append(cell)
    return cells


def _prepare_with_traffic(
    producer: PredictedLatencyProducer, eps: tuple[Endpoint, ...], iterations: int, rng: random.Random
) -> list[float]:
    """PrepareData (timed) between what changes while an EPP serves (untimed): see the module doc."""
    n = len(eps)
    rescrape = max(1, round(n * TRAFFIC_RESCRAPED))
    hits = max(1, round(n * TRAFFIC_PREFIX_HITS))
    total = 8
    none = PrefixMatchInfo(0, total, 16)
    matched = [PrefixMatchInfo(k, total, 16) for k in range(1, total + 1)]
    flight: deque[tuple[CycleState, InferenceRequest, Endpoint]] = deque()
    out = []
    for i in range(iterations):
        for _ in range(rescrape):
            eps[rng.randrange(n)].metrics = _metrics(rng)
        if len(flight) >= TRAFFIC_IN_FLIGHT:
            _answer(producer, *flight.popleft())
        state = CycleState()
        prefix: dict[Any, PrefixMatchInfo] = dict.fromkeys(eps, none)
        for _ in range(hits):
            prefix[eps[rng.randrange(n)]] = matched[rng.randrange(total)]
        state.set_attributes(PREFIX_MATCH, prefix)
        size = rng.randrange(400, 16000)
        req = InferenceRequest(
            request_id=f"t{i}",
            headers={"x-slo-ttft-ms": "300"},
            request_size_bytes=size,
            received_at=time.monotonic(),
        )
        t0 = time.perf_counter()
        producer.prepare(state, req, eps)
        out.append(time.perf_counter() - t0)
        target = eps[rng.randrange(n)]
        producer.pre_request(
            state, req, SchedulingResult({"default": ProfileRunResult((target,))}, "default")
        )
        flight.append((state, req, target))
    while flight:
        _answer(producer, *flight.popleft())
    return out


def _answer(
    producer: PredictedLatencyProducer, state: CycleState, req: InferenceRequest, target: Endpoint
) -> None:
    """The request's first token and its completion, now."""
    resp = ResponseInfo(request_id=req.request_id, streaming=True, first_chunk_at=time.monotonic())
    producer.response_body(state, req, resp, b"data: {}\n\n", target)
    resp.end_of_stream, resp.completed_at = True, time.monotonic()
    producer.response_complete(state, req, resp, target)


# --- 2. training CPU --------------------------------------------------------------------------------
def bench_training(trainings: int, rate: float = 100.0) -> dict[str, Any]:
    rng = np.random.default_rng(SEEDS["micro"])
    model = LatencyModel(capacity=1000)
    rows = rng.uniform(0, 5, (1000, N_FEATURES))
    t0 = time.thread_time()
    for r in rows:
        model.add_ttft(r, float(r.sum()))
        model.add_tpot(r, float(r.sum()) / 10)
    add_cpu = (time.thread_time() - t0) / (2 * len(rows))
    cpu = []
    for _ in range(trainings):
        t = time.thread_time()
        model.train()
        cpu.append(time.thread_time() - t)
    train_cpu = statistics.median(cpu)
    share = train_cpu * 1.0 + 2 * rate * add_cpu  # one training per second, two rows per request
    return {
        "rows_per_target": 1000,
        "train_cpu_ms_p50": round(1000 * train_cpu, 3),
        "train_cpu_ms_max": round(1000 * max(cpu), 3),
        "add_row_us": round(1e6 * add_cpu, 2),
        "rate_rps": rate,
        "cpu_share_of_one_core_pct": round(100 * share, 3),
        "loop_share_pct": round(100 * 2 * rate * add_cpu, 3),
    }


# --- 3/4. the fleet -----------------------------------------------------------------------------------
def workload(n: int, seed: int) -> list[tuple[bytes, int]]:
    """Streamed chats: one of 8 shared system prompts (0-6k chars) + a question (200-4k chars)."""
    rng = random.Random(seed)
    words = ["model", "cache", "prefix", "token", "request", "replica", "router", "queue", "batch", "kv"]
    systems = [" ".join(rng.choice(words) for _ in range(rng.randrange(0, 1200))) for _ in range(8)]
    jobs = []
    for i in range(n):
        question = " ".join(rng.choice(words) for _ in range(rng.randrange(40, 800)))
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": rng.choice(systems)},
                {"role": "user", "content": f"{i} {question}"},
            ],
            "max_tokens": rng.randrange(16, 128),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        jobs.append((orjson.dumps(body), i))
    return jobs


# The goodput workload: what one shared "assistant" deployment serves (docs/latency-prediction.md#goodput).
CHAT_SYSTEM_TOKENS = (300, 1500)  # one of 6 shared system prompts (product personas, tool specs)
CHAT_USER_TOKENS = (20, 300)  # the user's turn
CHAT_OUTPUT_TOKENS = (30, 250)
DOC_TOKENS = (2000, 16000)  # a document / retrieved context, log-uniform, never shared
DOC_OUTPUT_TOKENS = (100, 400)  # a summary or an extraction
DOC_BURST = (1, 4)  # documents submitted together (a folder, a multi-document question)
CHAT_ARRIVAL_SHARE = 5 / 7  # of arrivals; with bursts of 2.5 documents on average: half the requests


def _text(rng: random.Random, tokens: int) -> str:
    """``tokens`` tokens of filler text (the simulator and the EPP count 4 characters a token)."""
    words = ("model ", "cache ", "token ", "query ", "batch ", "route ", "reply ", "shard ")
    return "".join(rng.choice(words) for _ in range(tokens * 4 // 6 + 1))


def mixed_workload(n: int, seed: int) -> list[list[tuple[bytes, bool, str]]]:
    """``n`` arrivals of interactive chat turns and bursts of long-document jobs.

    An arrival is a chat turn (one request: a shared system prompt, a short user turn, a short
    reply; it carries the TTFT SLO) or a burst of 1-4 document jobs (a 2k-16k-token unique
    document, a summary of 100-400 tokens; no SLO: best effort).  About half the requests are
    chat turns.  Each request: (body, carries the SLO, kind).
    """
    rng = random.Random(seed)
    systems = [_text(rng, rng.randrange(*CHAT_SYSTEM_TOKENS)) for _ in range(6)]
    lo, hi = math.log(DOC_TOKENS[0]), math.log(DOC_TOKENS[1])
    arrivals: list[list[tuple[bytes, bool, str]]] = []
    for i in range(n):
        if rng.random() < CHAT_ARRIVAL_SHARE:
            messages = [
                {"role": "system", "content": rng.choice(systems)},
                {"role": "user", "content": f"{i} " + _text(rng, rng.randrange(*CHAT_USER_TOKENS))},
            ]
            body = {"model": MODEL, "messages": messages, "max_tokens": rng.randrange(*CHAT_OUTPUT_TOKENS)}
            arrivals.append([(_stream(body), True, "chat")])
            continue
        burst = []
        for j in range(rng.randint(*DOC_BURST)):
            doc = f"{i}.{j} " + _text(rng, int(math.exp(rng.uniform(lo, hi))))
            messages = [{"role": "user", "content": f"Summarise this document.\n\n{doc}"}]
            body = {"model": MODEL, "messages": messages, "max_tokens": rng.randrange(*DOC_OUTPUT_TOKENS)}
            burst.append((_stream(body), False, "doc"))
        arrivals.append(burst)
    return arrivals


def _stream(body: dict[str, Any]) -> bytes:
    return orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, out: list[dict[str, Any]], level: int,
               t_level: float, slo: bool, kind: str = "chat") -> None:  # fmt: skip
    headers = {"content-type": "application/json"}
    if slo:
        headers["x-slo-ttft-ms"] = str(SLO_TTFT_MS)
        headers["x-slo-tpot-ms"] = str(SLO_TPOT_MS)
    rec: dict[str, Any] = {"level": level, "at": time.perf_counter() - t_level, "slo": slo, "tokens": 0,
                           "kind": kind}  # fmt: skip
    t0 = rec["sent"] = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
            rec["status"] = r.status
            rec["replica"] = r.headers.get("x-inference-port")
            pred = r.headers.get("x-epp-predicted-ttft-ms")
            rec["predicted_ttft_ms"] = float(pred) if pred else None
            async for line in r.content:
                if line.startswith(b"data: ") and b'"content":"' in line:
                    rec["tokens"] += 1
                    if "ttft_ms" not in rec:
                        rec["ttft_ms"] = 1000 * (time.perf_counter() - t0)
    except (aiohttp.ClientError, TimeoutError) as e:
        rec["error"] = type(e).__name__
    rec["end"] = time.perf_counter()
    out.append(rec)


def _level_stats(records: list[dict[str, Any]], level: int, rate: float, seconds: float) -> dict[str, Any]:
    """One level's accuracy (the EPP's predictions vs measured TTFT), SLO attainment and throughput."""
    sent = [r for r in records if r["level"] == level]
    recs = [r for r in sent if r.get("status") == 200 and "ttft_ms" in r]
    measured = [r for r in recs if r["at"] >= seconds / 4 and r["predicted_ttft_ms"] is not None]
    signed = sorted((r["predicted_ttft_ms"] - r["ttft_ms"]) / r["ttft_ms"] for r in measured)
    errs = sorted(abs(e) for e in signed)
    ttfts = sorted(r["ttft_ms"] for r in recs)
    slo_sent = [r for r in sent if r["slo"]]
    slo_met = sum(1 for r in slo_sent if r.get("status") == 200 and r.get("ttft_ms", math.inf) <= SLO_TTFT_MS)
    span = (max(r["end"] for r in sent) - min(r["sent"] for r in sent)) if sent else 0.0
    return {
        "rate_rps": rate,
        "requests": len(sent),
        "ok": len(recs),
        "with_prediction": len(measured),
        "ttft_mdape_pct": round(100 * errs[len(errs) // 2], 1) if errs else None,
        "ttft_median_signed_pct_error": round(100 * signed[len(signed) // 2], 1) if signed else None,
        "ttft_p90_abs_pct_error": round(100 * errs[int(len(errs) * 0.9)], 1) if errs else None,
        "ttft_at_or_below_prediction_pct": round(
            100 * sum(1 for r in measured if r["ttft_ms"] <= r["predicted_ttft_ms"]) / len(measured), 1
        ) if measured else None,
        "ttft_p50_ms": round(ttfts[len(ttfts) // 2], 1) if ttfts else None,
        "ttft_p90_ms": round(ttfts[int(len(ttfts) * 0.9)], 1) if ttfts else None,
        "slo_requests": len(slo_sent),
        "slo_met": slo_met,
        "slo_met_pct": round(100 * slo_met / len(slo_sent), 1) if slo_sent else None,
        "completed_rps": round(len(recs) / span, 2) if span > 0 else None,
        "output_tokens": sum(r["tokens"] for r in recs),
        "failed": len(sent) - len(recs),
        **{f"{kind}_ttft_p90_ms": _p90([r["ttft_ms"] for r in recs if r.get("kind") == kind])
           for kind in sorted({r.get("kind", "chat") for r in sent})},
    }  # fmt: skip


def _p90(xs: list[float]) -> float | None:
    s = sorted(xs)
    return round(s[int(len(s) * 0.9)], 1) if s else None


async def _poisson_levels(
    rng: random.Random, rates: Sequence[float], seconds: float, starts: list[float], per_arrival: float = 1.0
) -> AsyncIterator[tuple[int, float, int]]:
    """Open-loop Poisson arrivals, level after level: waits until each arrival is due and yields
    (level, the level's start, the arrival's running index); each level's start is appended to
    ``starts``.  The arrival rate is ``rate * per_arrival`` (below 1 when one arrival carries a burst)."""
    k = 0
    for level, rate in enumerate(rates):
        start = time.perf_counter()
        starts.append(start)
        at = start
        while at - start < seconds:
            at += rng.expovariate(rate * per_arrival)
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            yield level, start, k
            k += 1
        log(f"  level {level}: {rate}/s sent")


async def run_levels(
    config: Path | None,
    rates: Sequence[float],
    seconds: float,
    learner: str | None,
    quantile: float | None = None,
    trace: Path | None = None,
    slo_share: float = 1.0,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """Poisson arrivals at each rate in turn on one fleet; ``config`` None is Envoy round robin (no EPP).

    ``slo_share``: the fraction of requests carrying the SLO headers (chosen by a seeded draw, so
    every router sees the same requests with the same headers).
    """
    env = {}
    if trace:
        env["EPP_LATENCY_TRACE"] = str(trace)
    if learner:
        env["EPP_LATENCY_LEARNER"] = learner
    if quantile:
        env["EPP_LATENCY_QUANTILE"] = str(quantile)
    jobs = workload(int(sum(rates) * seconds * 1.3) + 100, SEEDS["workload"])
    slo_rng = random.Random(SEEDS["workload"] + 1)
    with_slo = [slo_rng.random() < slo_share for _ in jobs]
    records: list[dict[str, Any]] = []
    starts: list[float] = []
    sim = ("--time-scale", str(time_scale), *SIM_ARGS)
    async with SimFleet(REPLICAS, *sim) as fleet, contextlib.AsyncExitStack() as stack:
        if config is None:
            envoy = await stack.enter_async_context(Envoy(EnvoyConfig(upstreams=fleet.hostports)))
        else:
            args = [f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1",
                    f"--config-file={config}"]  # fmt: skip
            epp = await stack.enter_async_context(EppProcess(*args, env=env))
            envoy = await stack.enter_async_context(Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)))
        rng = random.Random(SEEDS["arrivals"])
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
            tasks = []
            async for level, start, k in _poisson_levels(rng, rates, seconds, starts):
                tasks.append(asyncio.create_task(
                    _one(session, envoy.url, jobs[k][0], records, level, start, with_slo[k])
                ))  # fmt: skip
            await asyncio.gather(*tasks)
    if trace:  # the client's side of the traced run, for matching with the EPP's rows offline
        with trace.with_suffix(".client.jsonl").open("wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for r in records)
    return {
        "config": str(config.relative_to(ROOT)) if config else "envoy round robin",
        "learner": learner,
        "quantile": quantile,
        "slo_share": slo_share,
        "sim_time_scale": time_scale,
        "levels": [_level_stats(records, level, rate, seconds) for level, rate in enumerate(rates)],
        "level_starts": starts,
    }


Router = Path | PeerSpec | None  # an EPP config, a peer router, or None: Envoy round robin


async def run_goodput(
    router: Router, rates: Sequence[float], seconds: float, time_scale: float = 1.0
) -> dict[str, Any]:
    """The mixed workload (``mixed_workload``) at each rate in turn on a fresh fleet behind ``router``.

    Arrivals (a chat turn or a burst of documents) are Poisson with the rate scaled so that
    ``rate`` is requests per second; every router sees the same requests at the same offsets.
    """
    per_arrival = 1 / (CHAT_ARRIVAL_SHARE + (1 - CHAT_ARRIVAL_SHARE) * sum(DOC_BURST) / 2)
    arrivals = mixed_workload(int(sum(rates) * seconds * per_arrival * 1.5) + 100, SEEDS["workload"])
    records: list[dict[str, Any]] = []
    starts: list[float] = []
    sim = ("--time-scale", str(time_scale), *GOODPUT_SIM_ARGS)
    async with SimFleet(REPLICAS, *sim) as fleet, contextlib.AsyncExitStack() as stack:
        if router is None:
            url = (await stack.enter_async_context(Envoy(EnvoyConfig(upstreams=fleet.hostports)))).url
        elif isinstance(router, PeerSpec):
            url = (await stack.enter_async_context(PeerRouter(router, fleet.hostports))).url
        else:
            args = [f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1",
                    f"--config-file={router}"]  # fmt: skip
            epp = await stack.enter_async_context(EppProcess(*args))
            url = (await stack.enter_async_context(Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)))).url
        rng = random.Random(SEEDS["arrivals"])
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as session:
            tasks = []
            async for level, start, k in _poisson_levels(rng, rates, seconds, starts, per_arrival):
                for body, slo, kind in arrivals[k]:
                    tasks.append(
                        asyncio.create_task(_one(session, url, body, records, level, start, slo, kind))
                    )
            await asyncio.gather(*tasks)
    levels = [_level_stats(records, level, rate, seconds) for level, rate in enumerate(rates)]
    for lv, start in zip(levels, starts, strict=True):
        lv.update(_window_throughput(records, start, start + seconds))
    ok = [r for r in records if r.get("status") == 200 and "ttft_ms" in r]
    makespan = max(r["end"] for r in records) - starts[0]
    return {
        "router": _router_label(router),
        "records": records,
        "levels": levels,
        "level_starts": starts,
        "run": {  # the whole run, warm-up included: the same requests for every router
            "requests": len(records),
            "ok": len(ok),
            "output_tokens": sum(r["tokens"] for r in ok),
            "makespan_s": round(makespan, 1),
            "output_tokens_per_s": round(sum(r["tokens"] for r in ok) / makespan, 1),
        },
    }


def _window_throughput(records: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Throughput while a rate was offered: requests (of any level) finished in [t0, t1) and their
    tokens; and the backlog at ``t1``: requests sent and not finished, in all and on the replica
    with the most, and the documents among them that had no first token yet (queued or in prefill)."""
    done = [r for r in records if t0 <= r["end"] < t1 and r.get("status") == 200 and "ttft_ms" in r]
    open_ = [r for r in records if r["sent"] < t1 <= r["end"]]
    per_replica: dict[str, int] = {}
    for r in open_:
        per_replica[r.get("replica") or "?"] = per_replica.get(r.get("replica") or "?", 0) + 1
    return {
        "window_completed_rps": round(len(done) / (t1 - t0), 2),
        "window_output_tokens_per_s": round(sum(r["tokens"] for r in done) / (t1 - t0), 1),
        "in_flight_at_end": len(open_),
        "in_flight_at_end_max_replica": max(per_replica.values(), default=0),
        "docs_waiting_at_end": sum(
            1 for r in open_ if r.get("kind") == "doc" and r["sent"] + r.get("ttft_ms", math.inf) / 1000 > t1
        ),
    }


def _router_label(router: Router) -> str:
    if router is None:
        return "envoy round robin"
    if isinstance(router, PeerSpec):
        return router.label
    return str(router.relative_to(ROOT)) if router.is_relative_to(ROOT) else str(router)


def resolve_router(name: str) -> Router:
    """A name of ``ROUTERS``, or the path of an EPP config file (an experiment's variant)."""
    return ROUTERS[name] if name in ROUTERS or not name.endswith(".yaml") else Path(name).resolve()


ROUTERS: dict[str, Router] = {
    "default": DEFAULT_CONFIG,  # queue + KV + prefix scorers, max-score picker
    "predictor": PREDICTOR_CONFIG,  # GIE's predictor-enabled config as shipped in config/examples
    "predictor-gie-least": GIE_LEAST_CONFIG,  # the same with GIE's default headroomSelectionStrategy
    "predictor-max-score": MAX_SCORE_CONFIG,  # the predictor config with a max-score picker
    "predictor-mixed-slo": MIXED_SLO_CONFIG,  # + bestEffortTTFTMs (an SLO reserve), max-score picker
    "predictor-mixed-slo-pack": MIXED_SLO_PACK_CONFIG,  # the same, packing best-effort (not work-conserving)
    "round-robin": None,  # Envoy alone
    "sglang-cache-aware": PeerSpec("sglang-router", "cache_aware"),
    "vllm-cache-aware": PeerSpec("vllm-router", "cache_aware"),
}
QUICK_ROUTERS = ("default", "predictor-mixed-slo", "round-robin")
GOODPUT_TIME_SCALE = 1.0  # the simulator at its modelled speed (see --goodput-time-scale)
# KV cache: the simulator's default 26,000 blocks (416k tokens, an 8B model on an 80 GB GPU)
GOODPUT_SIM_ARGS = ("--seed", str(SEEDS["sim"]), "--model", MODEL, "--max-model-len", "32768")
GOAL_RATIO = 1.3
# The judging rate: the first rate of the ladder at which the default config meets the SLO for at
# most 1/1.3 of the SLO requests, the first rate at which 1.3x is arithmetically possible at all.
JUDGE_DEFAULT_MAX_PCT = 100.0 / GOAL_RATIO
_CELL_KEYS = (
    "slo_met", "slo_met_pct", "ttft_p50_ms", "ttft_p90_ms", "chat_ttft_p90_ms", "doc_ttft_p90_ms",
    "requests", "ok", "failed", "output_tokens", "window_completed_rps", "window_output_tokens_per_s",
    "in_flight_at_end", "in_flight_at_end_max_replica", "docs_waiting_at_end",
)  # fmt: skip


def goodput_summary(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate: each router's SLO attainment, TTFT p90 and throughput; every router vs the default config."""
    rows = []
    for i, lv in enumerate(runs["default"]["levels"]):
        row: dict[str, Any] = {"rate_rps": lv["rate_rps"], "slo_requests": lv["slo_requests"]}
        for name, run in runs.items():
            cell = run["levels"][i]
            out = row[name] = {k: cell.get(k) for k in _CELL_KEYS}
            out["goodput_ratio_vs_default"] = (
                round(cell["slo_met"] / lv["slo_met"], 3) if lv["slo_met"] else None
            )
            out["output_tokens_ratio_vs_default"] = (
                round(cell["output_tokens"] / lv["output_tokens"], 3) if lv["output_tokens"] else None
            )
            d_window, window = lv.get("window_output_tokens_per_s"), cell.get("window_output_tokens_per_s")
            out["window_tokens_ratio_vs_default"] = (
                round(window / d_window, 3) if d_window and window else None
            )
            d_done, done = lv.get("window_completed_rps"), cell.get("window_completed_rps")
            out["window_completed_ratio_vs_default"] = round(done / d_done, 3) if d_done and done else None
        judged = judged_router(runs)
        if judged:
            row["judged_router"] = judged
            row["goodput_ratio_vs_default"] = row[judged]["goodput_ratio_vs_default"]
            row["output_tokens_ratio_vs_default"] = row[judged]["output_tokens_ratio_vs_default"]
            row["window_tokens_ratio_vs_default"] = row[judged]["window_tokens_ratio_vs_default"]
            row["window_completed_ratio_vs_default"] = row[judged]["window_completed_ratio_vs_default"]
        rows.append(row)
    return rows


def judged_router(runs: dict[str, Any]) -> str | None:
    """The predictor config the goal is judged on: the mixed-SLO example when it ran, else the example."""
    return next((r for r in ("predictor-mixed-slo", "predictor") if r in runs), None)


def judging_rate(goodput: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first row at which the default config met the SLO for at most 1/1.3 of the SLO requests."""
    return next((g for g in goodput if (g["default"]["slo_met_pct"] or 0) <= JUDGE_DEFAULT_MAX_PCT), None)


THROUGHPUT_GOAL = 0.97  # "does not lose throughput", within the noise of one 25-s level


def window_goals(goodput: list[dict[str, Any]], judge: dict[str, Any]) -> dict[str, Any]:
    """The in-window throughput goals (what finished while a rate was offered, deferred work
    counts against it): requests and output tokens per second of the judged router against the
    default config's, at the judging rate and, worst case, at every rate from it up."""
    goals: dict[str, Any] = {}
    if len({g["rate_rps"] for g in goodput}) == 1:  # one rate held: its windows summed, not the worst one
        return held_rate_goals(goodput)
    for key, ratio_key in (("window_output_tokens", "window_tokens_ratio_vs_default"),
                           ("window_completed_requests", "window_completed_ratio_vs_default")):  # fmt: skip
        value = judge.get(ratio_key)
        goals[f"{key}_ratio_at_judging_rate"] = {
            "goal": THROUGHPUT_GOAL, "value": value, "met": bool(value and value >= THROUGHPUT_GOAL)
        }  # fmt: skip
        above = [g.get(ratio_key) for g in goodput if g["rate_rps"] >= judge["rate_rps"]]
        worst = min((v for v in above if v is not None), default=None)
        goals[f"{key}_ratio_min_from_judging_rate"] = {
            "goal": THROUGHPUT_GOAL, "value": worst, "met": bool(worst and worst >= THROUGHPUT_GOAL)
        }  # fmt: skip
    return goals


def held_rate_goals(goodput: list[dict[str, Any]]) -> dict[str, Any]:
    """A steady-load run (one rate in every window): goodput and in-window throughput of the
    judged router over all the windows together against the default config's; a single window
    swings with the bursts that finish on either side of its edges."""
    judged = goodput[0].get("judged_router")
    if not judged:
        return {}

    def total(router: str, key: str) -> float:
        return float(sum(g[router][key] or 0 for g in goodput))

    goals: dict[str, Any] = {}
    met = total(judged, "slo_met") / total("default", "slo_met")
    goals["goodput_ratio_held_rate"] = {"goal": GOAL_RATIO, "value": round(met, 3), "met": met >= GOAL_RATIO}
    for key, cell in (("window_output_tokens", "window_output_tokens_per_s"),
                      ("window_completed_requests", "window_completed_rps")):  # fmt: skip
        ratio = total(judged, cell) / total("default", cell)
        goals[f"{key}_ratio_held_rate"] = {
            "goal": THROUGHPUT_GOAL, "value": round(ratio, 3), "met": ratio >= THROUGHPUT_GOAL
        }  # fmt: skip
    return goals


def rederive(name: str) -> dict[str, Any]:
    """Recompute the goodput summary and goals of a written result (bench/results/<name>.json)."""
    doc = read_result(name)
    assert doc is not None, name
    runs = doc["goodput_runs"]
    doc["goodput"] = goodput = goodput_summary(runs)
    judge = judging_rate(goodput)
    if judge is not None:
        doc["goals"] = {k: v for k, v in doc["goals"].items() if not k.startswith("window_")}
        doc["goals"].update(window_goals(goodput, judge))
    (ROOT / "bench" / "results" / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations, one learner, shorter levels")
    ap.add_argument(
        "--learners", default="", help=f"accuracy runs, of {','.join(LEARNERS)} (default ridge-log)"
    )
    ap.add_argument("--rates", default="5,15,25,35,50,65", help="accuracy: requests/s per level (4 replicas)")
    ap.add_argument("--seconds", type=float, default=0.0, help="accuracy: seconds per level (12, quick 8)")
    ap.add_argument(
        "--goodput-rates", default="", help="goodput: requests/s per level (6,9,12,15; quick 9,12)"
    )
    ap.add_argument("--goodput-seconds", type=float, default=0.0, help="goodput: s per level (25, quick 12)")
    ap.add_argument(
        "--routers",
        default="",
        help="goodput: of "
        + ",".join(ROUTERS)
        + " or EPP config files (*.yaml; quick: "
        + ",".join(QUICK_ROUTERS)
        + ")",
    )
    ap.add_argument(
        "--goodput-time-scale",
        type=float,
        default=GOODPUT_TIME_SCALE,
        help="goodput: the "
        "simulator's wall seconds per modelled second (2: a GPU half as fast, so the knee comes "
        "at half the request rate and the EPP process is not what saturates this machine)",
    )
    ap.add_argument("--keep-records", action="store_true", help="goodput: also write every request's record")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--no-goodput", action="store_true")
    ap.add_argument(
        "--accuracy-routers",
        default="predictor",
        help="accuracy: the configs whose predictions are measured, of predictor,predictor-gie-least,"
        "predictor-max-score (GIE's least packs load up to the SLO: the most queueing)",
    )
    ap.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="accuracy: EPP_LATENCY_TRACE file (+ .client.jsonl), for bench.latency_replay",
    )
    ap.add_argument("--result-name", default="latency", help="bench/results/<name>.json")
    args = ap.parse_args(argv)
    seconds = args.seconds or (8.0 if args.quick else 12.0)
    rates = [float(r) for r in args.rates.split(",")]
    g_rates = [float(r) for r in (args.goodput_rates or ("9,12" if args.quick else "6,9,12,15")).split(",")]
    g_seconds = args.goodput_seconds or (12.0 if args.quick else 25.0)
    learners = (args.learners or DEFAULT_LEARNER).split(",")

    prediction = bench_prediction(300 if args.quick else 3000)
    for c in prediction:
        log(f"{c['endpoints']:>5} endpoints: prepare p50 {c['prepare_data_us']['p50']} µs "
            f"(with traffic {c['prepare_data_traffic_us']['p50']} µs), "
            f"predict p50 {c['predict_us']['p50']} µs (p99 {c['predict_us']['p99']}); prepare / predict "
            f"{c['prepare_over_product']}x (with traffic {c['traffic_over_product']}x)")  # fmt: skip
    training = bench_training(20 if args.quick else 200)
    log(f"training: {training}")

    accuracy = []
    cells = [(r, lr) for r in args.accuracy_routers.split(",") for lr in learners]
    for router, learner in [] if args.no_accuracy else cells:  # the median model: MdAPE is its metric
        log(f"accuracy, {router}, learner {learner}, quantile 0.5, rates {rates}, {seconds}s each")
        config = ROUTERS[router]
        assert isinstance(config, Path), "accuracy needs an EPP with the predictor"
        trace = args.trace.with_name(f"{args.trace.stem}-{router}.jsonl") if args.trace else None
        res = asyncio.run(run_levels(config, rates, seconds, learner, 0.5, trace))
        res["router"] = router
        for lv in res["levels"]:
            log(f"  {lv}")
        accuracy.append(res)
    goodput_runs: dict[str, dict[str, Any]] = {}
    names = args.routers.split(",") if args.routers else list(QUICK_ROUTERS if args.quick else ROUTERS)
    for name in [] if args.no_goodput else names:
        chosen = resolve_router(name)
        if isinstance(chosen, PeerSpec) and not peer_installed(chosen.tool):
            log(f"goodput, {name}: {chosen.tool} is not installed (python -m bench.setup), skipped")
            continue
        log(f"goodput, {name}: mixed chat/document workload, rates {g_rates}")
        # an unmeasured warm-up level at half the first rate: a learning router starts from nothing
        run = asyncio.run(run_goodput(chosen, [g_rates[0] / 2, *g_rates], g_seconds, args.goodput_time_scale))
        run["warmup"], run["levels"] = run["levels"][0], run["levels"][1:]
        records = run.pop("records")
        if args.keep_records:
            (ROOT / "bench" / "results" / f"{args.result_name}-{Path(name).stem}-records.json").write_bytes(
                orjson.dumps(records)
            )
        goodput_runs[name] = run
        for lv in run["levels"]:
            log(f"  {lv}")
    goodput = goodput_summary(goodput_runs) if "default" in goodput_runs else None
    goals: dict[str, Any] = {}
    at100 = next(c for c in prediction if c["endpoints"] == 100)
    goals["predict_us_100_endpoints"] = {
        "goal": GOALS["predict_us_100_endpoints"],
        "value": at100["predict_us"]["p50"],
        "met": at100["predict_us"]["p50"] <= GOALS["predict_us_100_endpoints"],
    }
    goals["training_cpu_pct_at_100rps"] = {
        "goal": 5.0,
        "value": training["cpu_share_of_one_core_pct"],
        "met": training["cpu_share_of_one_core_pct"] <= 5.0,
    }
    if accuracy:
        worst = max(lv["ttft_mdape_pct"] or math.inf for run in accuracy for lv in run["levels"])
        goals["ttft_mdape_pct_worst_level"] = {"goal": 20.0, "value": worst, "met": worst <= 20.0}
    if goodput and judged_router(goodput_runs):
        judge = judging_rate(goodput)
        if judge is None:
            log(f"goodput: the default config met the SLO for more than {JUDGE_DEFAULT_MAX_PCT:.1f}% "
                "at every rate: 1.3x is not reachable anywhere on this ladder")  # fmt: skip
        else:
            ratio, tokens = judge["goodput_ratio_vs_default"], judge["output_tokens_ratio_vs_default"]
            goals["goodput_ratio_at_judging_rate"] = {
                "goal": GOAL_RATIO, "rate_rps": judge["rate_rps"], "router": judge["judged_router"],
                "value": ratio,
                "met": bool(ratio and ratio >= GOAL_RATIO),
            }  # fmt: skip
            goals["output_tokens_ratio_at_judging_rate"] = {
                "goal": 0.95, "value": tokens, "met": bool(tokens and tokens >= 0.95)
            }  # fmt: skip
            # the stricter reading: what finished while the rates were offered (deferred work counts)
            goals.update(window_goals(goodput, judge))
        for g in goodput:
            log(f"goodput at {g['rate_rps']}/s: " + ", ".join(
                f"{n} {g[n]['slo_met_pct']}% (chat p90 {g[n]['chat_ttft_p90_ms']} ms, {g[n]['ok']} ok, "
                f"{g[n]['output_tokens']} tok)" for n in goodput_runs
            ) + f"; {g.get('judged_router')}/default {g.get('goodput_ratio_vs_default')}")  # fmt: skip
    for name, goal in goals.items():
        log(f"goal {name}: {goal}")
    doc = {
        "settings": {
            "replicas": REPLICAS,
            "sim_args": list(SIM_ARGS),
            "accuracy_rates": rates,
            "accuracy_seconds_per_level": seconds,
            "goodput_rates": g_rates,
            "goodput_seconds_per_level": g_seconds,
            "slo_ttft_ms": SLO_TTFT_MS,
            "slo_tpot_ms": SLO_TPOT_MS,
            "goodput_sim_args": list(GOODPUT_SIM_ARGS),
            "goodput_sim_time_scale": args.goodput_time_scale,
            "goodput_workload": {
                "chat_system_tokens": CHAT_SYSTEM_TOKENS,
                "chat_user_tokens": CHAT_USER_TOKENS,
                "chat_output_tokens": CHAT_OUTPUT_TOKENS,
                "doc_tokens": DOC_TOKENS,
                "doc_output_tokens": DOC_OUTPUT_TOKENS,
                "doc_burst": DOC_BURST,
                "chat_arrival_share": CHAT_ARRIVAL_SHARE,
                "slo": "chat turns",
            },
            "judging": f"judged at the first rate at which the default config meets the SLO for <= "
            f"{JUDGE_DEFAULT_MAX_PCT:.1f} % of the SLO requests",
        },
        "prediction": prediction,
        "training": training,
        "accuracy": accuracy,
        "goodput_runs": goodput_runs,
        "goodput": goodput,
        "goals": goals,
    }
    path = write_result(args.result_name, doc, mode="quick" if args.quick else "full", seeds=SEEDS)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
