"""The in-process latency predictor: prediction cost, training CPU, accuracy and goodput on the simulator.

    python -m bench.latency [--quick] [--learners ridge-rel,ridge,ridge-log] [--no-goodput]

1. **Prediction cost** (in process): ``predicted-latency-producer``'s PrepareData (feature
   matrix, one matrix product, a ``LatencyPredictionInfo`` per candidate) and the bare model
   product, at 10/100/1000 endpoints; wall-clock p50/p99 in µs.
2. **Training CPU** (in process): thread CPU of one training on full rings (1000 rows per
   target, the default ``LATENCY_MAX_SAMPLE_SIZE``) and of appending one row; the share of one
   core at 100 requests/s (two rows per request, one training per second).
3. **Accuracy** on a simulated fleet through Envoy (``epp-sim``, 4 replicas, real time): GIE's
   predictor config (config/examples/predicted-latency.yaml), streamed chat with SLO headers,
   Poisson arrivals at increasing rates on one EPP (the model keeps learning across levels).
   Each response carries the EPP's prediction for the chosen replica
   (``x-epp-predicted-ttft-ms``); the client measures TTFT (send to first content event).
   Per level, the MdAPE of TTFT after the level's first quarter (warm-up); per learner
   (``EPP_LATENCY_LEARNER``), predicting the median (``EPP_LATENCY_QUANTILE=0.5``).
4. **Goodput**: the share of requests whose measured TTFT meets the SLO, predictor config with
   its defaults (ridge-log predicting p90) vs the default config (config/default.yaml), same
   workload and rates, and the same predictor config with ``headroomSelectionStrategy: most``
   (bench/configs/predicted-latency-most.yaml); for the p90 model, how often the measured TTFT
   was at or below it.

Writes bench/results/latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench.common import ROOT, log, write_result
from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.director.latency.model import LEARNERS, N_FEATURES, LatencyModel
from epp.director.producers.predicted_latency import PredictedLatencyParams, PredictedLatencyProducer
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

MODEL = "mock-model"
SEEDS = {"sim": 1, "workload": 42, "arrivals": 7, "micro": 3}
ENDPOINTS = (10, 100, 1000)
GOALS = {"predict_us_100_endpoints": 50.0}
PREDICTOR_CONFIG = ROOT / "config" / "examples" / "predicted-latency.yaml"
DEFAULT_CONFIG = ROOT / "config" / "default.yaml"
MOST_CONFIG = ROOT / "bench" / "configs" / "predicted-latency-most.yaml"  # headroomSelectionStrategy: most
SLO_TTFT_MS = 400.0
SLO_TPOT_MS = 60.0
REPLICAS = 4
# KV cache of 4000 blocks x 16 = 64k tokens per replica: at the top rate it fills and requests queue.
SIM_ARGS = ("--time-scale", "1.0", "--seed", str(SEEDS["sim"]), "--num-gpu-blocks", "4000",
            "--model", MODEL, "--max-model-len", "32768")  # fmt: skip


class _Handle:
    def plugin(self, name: str) -> Any:
        raise KeyError(name)

    def plugins(self) -> list[Any]:
        return []


# --- 1. prediction cost -------------------------------------------------------------------------
def _endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    now = time.monotonic()
    return [
        Endpoint(
            EndpointMetadata(name=f"bench/pod-{i}-rank-0", address=f"10.0.{i // 256}.{i % 256}", port=8000),
            Metrics(
                waiting_queue_size=rng.randrange(0, 20),
                kv_cache_usage_percent=rng.random(),
                running_requests_size=rng.randrange(0, 50),
                update_time=now,
            ),
        )
        for i in range(n)
    ]


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
        cells.append({"endpoints": n, "prepare_data_us": _stats_us(prep), "predict_us": _stats_us(pred)})
    return cells


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


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, out: list[dict[str, Any]], level: int,
               t_level: float) -> None:  # fmt: skip
    headers = {
        "content-type": "application/json",
        "x-slo-ttft-ms": str(SLO_TTFT_MS),
        "x-slo-tpot-ms": str(SLO_TPOT_MS),
    }
    rec: dict[str, Any] = {"level": level, "at": time.perf_counter() - t_level}
    t0 = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
            rec["status"] = r.status
            pred = r.headers.get("x-epp-predicted-ttft-ms")
            rec["predicted_ttft_ms"] = float(pred) if pred else None
            async for line in r.content:
                if "ttft_ms" not in rec and line.startswith(b"data: ") and b'"content":"' in line:
                    rec["ttft_ms"] = 1000 * (time.perf_counter() - t0)
    except (aiohttp.ClientError, TimeoutError) as e:
        rec["error"] = type(e).__name__
    out.append(rec)


async def run_levels(
    config: Path,
    rates: Sequence[float],
    seconds: float,
    learner: str | None,
    quantile: float | None = None,
    trace: Path | None = None,
) -> dict[str, Any]:
    env = {}
    if trace:
        env["EPP_LATENCY_TRACE"] = str(trace)
    if learner:
        env["EPP_LATENCY_LEARNER"] = learner
    if quantile:
        env["EPP_LATENCY_QUANTILE"] = str(quantile)
    jobs = workload(int(sum(rates) * seconds * 1.3) + 100, SEEDS["workload"])
    records: list[dict[str, Any]] = []
    async with SimFleet(REPLICAS, *SIM_ARGS) as fleet:
        args = [f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1",
                f"--config-file={config}"]  # fmt: skip
        async with (
            EppProcess(*args, env=env) as epp,
            Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy,
        ):
            rng = random.Random(SEEDS["arrivals"])
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=120)
            ) as session:
                tasks = []
                k = 0
                starts = []
                for level, rate in enumerate(rates):
                    start = time.perf_counter()
                    starts.append(start)
                    at = start
                    while at - start < seconds:
                        at += rng.expovariate(rate)
                        delay = at - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        tasks.append(
                            asyncio.create_task(_one(session, envoy.url, jobs[k][0], records, level, start))
                        )
                        k += 1
                    log(f"  level {level}: {rate}/s sent")
                await asyncio.gather(*tasks)
    per_level = []
    for level, rate in enumerate(rates):
        recs = [r for r in records if r["level"] == level and r.get("status") == 200 and "ttft_ms" in r]
        measured = [r for r in recs if r["at"] >= seconds / 4 and r["predicted_ttft_ms"] is not None]
        errs = sorted(abs(r["predicted_ttft_ms"] - r["ttft_ms"]) / r["ttft_ms"] for r in measured)
        ttfts = sorted(r["ttft_ms"] for r in recs)
        per_level.append({
            "rate_rps": rate,
            "requests": sum(1 for r in records if r["level"] == level),
            "ok": len(recs),
            "with_prediction": len(measured),
            "ttft_mdape_pct": round(100 * errs[len(errs) // 2], 1) if errs else None,
            "ttft_median_signed_pct_error": round(100 * statistics.median(
                (r["predicted_ttft_ms"] - r["ttft_ms"]) / r["ttft_ms"] for r in measured), 1) if measured else None,
            "ttft_p90_abs_pct_error": round(100 * errs[int(len(errs) * 0.9)], 1) if errs else None,
            "ttft_at_or_below_prediction_pct": round(
                100 * sum(1 for r in measured if r["ttft_ms"] <= r["predicted_ttft_ms"]) / len(measured), 1
            ) if measured else None,
            "ttft_p50_ms": round(ttfts[len(ttfts) // 2], 1) if ttfts else None,
            "ttft_p90_ms": round(ttfts[int(len(ttfts) * 0.9)], 1) if ttfts else None,
            "slo_met_pct": round(100 * sum(1 for t in ttfts if t <= SLO_TTFT_MS) / max(
                1, sum(1 for r in records if r["level"] == level)), 1),
        })  # fmt: skip
    return {
        "config": str(config.relative_to(ROOT)),
        "learner": learner,
        "quantile": quantile,
        "levels": per_level,
        "level_starts": starts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations, shorter levels")
    ap.add_argument("--learners", default=",".join(LEARNERS))
    ap.add_argument("--rates", default="10,25,40,55", help="requests/s per level (4 replicas)")
    ap.add_argument("--seconds", type=float, default=0.0, help="seconds per level (default 20, quick 10)")
    ap.add_argument("--no-goodput", action="store_true")
    ap.add_argument("--result-name", default="latency", help="bench/results/<name>.json")
    args = ap.parse_args(argv)
    seconds = args.seconds or (10.0 if args.quick else 20.0)
    rates = [float(r) for r in args.rates.split(",")]

    prediction = bench_prediction(300 if args.quick else 3000)
    for c in prediction:
        log(f"{c['endpoints']:>5} endpoints: prepare p50 {c['prepare_data_us']['p50']} µs, "
            f"predict p50 {c['predict_us']['p50']} µs (p99 {c['predict_us']['p99']})")  # fmt: skip
    training = bench_training(20 if args.quick else 200)
    log(f"training: {training}")

    accuracy = []
    for learner in args.learners.split(","):  # the median (quantile 0.5) model: MdAPE is its metric
        log(f"accuracy, learner {learner}, quantile 0.5, rates {rates}, {seconds}s each")
        res = asyncio.run(run_levels(PREDICTOR_CONFIG, rates, seconds, learner, 0.5))
        for lv in res["levels"]:
            log(f"  {lv}")
        accuracy.append(res)
    goodput = None
    if not args.no_goodput:
        log("goodput, predictor config with its defaults (ridge-log, p90)")
        chosen = asyncio.run(run_levels(PREDICTOR_CONFIG, rates, seconds, None))
        for lv in chosen["levels"]:
            log(f"  {lv}")
        accuracy.append(chosen)
        log("goodput, predictor config with headroomSelectionStrategy: most")
        most = asyncio.run(run_levels(MOST_CONFIG, rates, seconds, None))
        for lv in most["levels"]:
            log(f"  {lv}")
        accuracy.append(most)
        log("goodput, default config")
        default = asyncio.run(run_levels(DEFAULT_CONFIG, rates, seconds, None))
        for lv in default["levels"]:
            log(f"  {lv}")
        goodput = [
            {
                "rate_rps": d["rate_rps"],
                "default_slo_met_pct": d["slo_met_pct"],
                "predictor_slo_met_pct": p["slo_met_pct"],
                "predictor_most_slo_met_pct": m["slo_met_pct"],
                "default_ttft_p90_ms": d["ttft_p90_ms"],
                "predictor_ttft_p90_ms": p["ttft_p90_ms"],
                "predictor_most_ttft_p90_ms": m["ttft_p90_ms"],
            }
            for d, p, m in zip(default["levels"], chosen["levels"], most["levels"], strict=True)
        ]
        accuracy.append(default)
    at100 = next(c for c in prediction if c["endpoints"] == 100)
    doc = {
        "settings": {
            "replicas": REPLICAS,
            "sim_args": list(SIM_ARGS),
            "rates": rates,
            "seconds_per_level": seconds,
            "slo_ttft_ms": SLO_TTFT_MS,
            "slo_tpot_ms": SLO_TPOT_MS,
        },
        "prediction": prediction,
        "training": training,
        "runs": accuracy,
        "goodput": goodput,
        "goals": {
            "predict_us_100_endpoints": {
                "goal": GOALS["predict_us_100_endpoints"],
                "value": at100["predict_us"]["p50"],
                "met": at100["predict_us"]["p50"] <= GOALS["predict_us_100_endpoints"],
            },
        },
    }
    path = write_result(args.result_name, doc, mode="quick" if args.quick else "full", seeds=SEEDS)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
