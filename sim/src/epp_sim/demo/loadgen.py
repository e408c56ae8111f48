"""An open-loop load generator for OpenAI-style streaming requests (demo and benchmarks).

Arrivals follow a seeded Poisson process and are never held back by slow responses
(open loop), and latencies are measured from each request's *scheduled* send time, so a
stalled system cannot hide its queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

_TOKEN = re.compile(rb'"(?:content|text)":"[^"]')  # a streamed event that carries generated text


@dataclass(frozen=True, slots=True)
class Job:
    path: str
    body: bytes


@dataclass(slots=True)
class Result:
    status: int = 0
    ttft: float = 0.0  # seconds from scheduled send to the first streamed token
    latency: float = 0.0  # seconds from scheduled send to the end of the response
    output_tokens: int = 0
    served_by: str = ""  # x-inference-pod of the replica that answered
    error: str = ""


def shared_prefix_jobs(
    *,
    groups: int,
    prompts_per_group: int,
    system_chars: int,
    question_chars: int,
    max_tokens: int,
    model: str,
    seed: int,
) -> list[Job]:
    """llm-d's shared-prefix workload: per group a long system prompt, then distinct questions.

    Requests are shuffled so groups interleave, as users' conversations do.
    """
    rng = random.Random(seed)
    words = [
        "model",
        "cache",
        "prefix",
        "token",
        "request",
        "server",
        "gateway",
        "route",
        "latency",
        "batch",
        "queue",
        "memory",
    ]

    def text(n: int) -> str:
        out: list[str] = []
        size = 0
        while size < n:
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)[:n]

    jobs = []
    for g in range(groups):
        system = f"[group {g}] " + text(system_chars)
        for _ in range(prompts_per_group):
            body = {
                "model": model,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": text(question_chars)},
                ],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            jobs.append(Job("/v1/chat/completions", orjson.dumps(body)))
    rng.shuffle(jobs)
    return jobs


async def _one(session: aiohttp.ClientSession, url: str, job: Job, scheduled: float) -> Result:
    res = Result()
    try:
        async with session.post(
            url + job.path, data=job.body, headers={"content-type": "application/json"}
        ) as r:
            res.status = r.status
            res.served_by = r.headers.get("x-inference-pod", "")
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                if not res.ttft and _TOKEN.search(line):
                    res.ttft = time.perf_counter() - scheduled
                if b'"usage"' in line and b'"completion_tokens"' in line:
                    usage = orjson.loads(line[6:]).get("usage") or {}
                    res.output_tokens = int(usage.get("completion_tokens", 0))
        res.latency = time.perf_counter() - scheduled
    except (aiohttp.ClientError, TimeoutError) as e:
        res.error = type(e).__name__
        res.latency = time.perf_counter() - scheduled
    return res


async def run_open_loop(
    url: str, jobs: Sequence[Job], *, rate: float, seed: int, timeout: float = 300.0
) -> tuple[list[Result], float]:
    """Send ``jobs`` at Poisson ``rate``/s; return the results and the wall time of the run."""
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        start = time.perf_counter()
        at = start
        tasks = []
        for job in jobs:
            at += rng.expovariate(rate)
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, job, at)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass(slots=True)
class Summary:
    requests: int
    ok: int
    ttft_p50: float
    ttft_p90: float
    latency_p50: float
    latency_p90: float
    output_tokens_per_s: float
    per_replica: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, results: Sequence[Result], wall: float) -> Summary:
        ok = [r for r in results if r.status == 200 and not r.error]
        ttfts = [r.ttft for r in ok if r.ttft]
        lats = [r.latency for r in ok]
        return cls(
            requests=len(results),
            ok=len(ok),
            ttft_p50=percentile(ttfts, 50),
            ttft_p90=percentile(ttfts, 90),
            latency_p50=percentile(lats, 50),
            latency_p90=percentile(lats, 90),
            output_tokens_per_s=sum(r.output_tokens for r in ok) / wall if wall > 0 else 0.0,
            per_replica=Counter(r.served_by for r in ok),
        )
