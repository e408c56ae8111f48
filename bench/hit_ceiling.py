"""What prefix-cache hit rate any router could reach on the shared-prefix profile (section 1b).

Two ceilings, per request count, computed by replaying the workload's shape (a random permutation
of groups x prompts, as inference-perf's shared_prefix data walks it; requests past the last
prompt wrap around) against a model of the fleet's caches:

- ``unbounded``: every replica's KV cache infinite, every group on one replica.  Only the first
  request of each group and the unique question misses: the ceiling of routing alone.
- ``perfect_placement``: each group pinned to one replica (groups spread evenly), each replica's
  cache the benchmark's ``kv_blocks``, evicting as vLLM (and the simulator) do: a finished
  request's blocks join the LRU free queue tail-first, so its question and output go before its
  shared prefix.  Requests are taken one at a time (no blocks pinned by running requests), so this
  is still an upper bound for a router that must also balance load.

Hit rate = cached / prompt tokens, as the replicas' ``prefix_cache_hits / prefix_cache_queries``;
the engine recomputes at least the last prompt token, so a full hit is one block short.

``fleet_bounds`` turns a hit rate into what any router could get from the fleet (the simulator's
time model: an upper bound on output tokens/s, a lower bound on TTFT p90 with first-come-first-served
engines), ``min_hit_rate`` the hit rate a goal needs.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

SEED = 0


def hit_ceilings(
    *,
    groups: int,
    prompts_per_group: int,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    kv_blocks: int,
    block_size: int,
    replicas: int,
    requests: int,
    **_: Any,
) -> dict[str, float]:
    return {
        "unbounded": _replay(
            groups,
            prompts_per_group,
            system_tokens,
            question_tokens,
            output_tokens,
            0,
            block_size,
            1,
            requests,
        ),
        "perfect_placement": _replay(
            groups,
            prompts_per_group,
            system_tokens,
            question_tokens,
            output_tokens,
            kv_blocks,
            block_size,
            replicas,
            requests,
        ),
    }


def _replay(
    groups: int,
    per_group: int,
    system: int,
    question: int,
    output: int,
    capacity: int,  # blocks per replica; 0: unbounded
    bs: int,
    replicas: int,
    requests: int,
) -> float:
    prompts = [(g, p) for g in range(groups) for p in range(per_group)]
    random.Random(SEED).shuffle(prompts)
    caches: list[OrderedDict[tuple[Any, ...], None]] = [OrderedDict() for _ in range(replicas)]
    sys_blocks, q_blocks, out_blocks = system // bs, question // bs, -(-output // bs)
    hits = queries = 0
    for i in range(requests):
        g, p = prompts[i % len(prompts)]
        cache = caches[g % replicas]
        # a request past the last prompt repeats one: the same text, its question cached too
        blocks = [("s", g, j) for j in range(sys_blocks)] + [("q", g, p, j) for j in range(q_blocks)]
        matched = 0
        for b in blocks:
            if b not in cache:
                break
            matched += 1
        hits += min(matched, len(blocks) - 1) * bs
        queries += system + question
        held = [*blocks, *(("o", i, j) for j in range(out_blocks))]
        for b in reversed(held):  # freed tail first: the prefix is the most recently used
            cache.pop(b, None)
            cache[b] = None
        while capacity and len(cache) > capacity:
            cache.popitem(last=False)
    return round(hits / queries, 4) if queries else 0.0


def fleet_bounds(
    *,
    rate: float,
    duration_s: float,
    hit_rate: float,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    replicas: int,
    **_: Any,
) -> dict[str, float]:
    """What any router can get out of the simulated fleet at ``hit_rate`` (cached / prompt tokens).

    From the simulator's time model (epp_sim.timing: step = base + prefill·tokens + per_seq·decodes +
    per_1k·context), every request costs its replica at least
    ``t = prefill·p + base·p/max_num_batched_tokens + output·(per_seq + per_1k·context/1000)`` ms of
    busy time, p = prompt·(1 - hit_rate) uncached tokens (a step's base cost shared by a full 8,192-token
    chunk and every decode riding along for free: optimistic).  The fleet then serves at most
    C = replicas·1000/t requests a second, so:

    - output tokens/s ≤ output·min(rate, C);
    - with engines serving first come first served (vLLM's default), perfect balance and every
      request at ``hit_rate``, the queue grows by (rate - C) requests a second; the request at the
      90th percentile of arrivals (0.9·duration) waits (rate - C)·0.9·duration / C, then prefills
      its own p tokens: a lower bound on TTFT p90.
    """
    from epp_sim.config import EngineConfig

    cfg = EngineConfig()
    prompt = system_tokens + question_tokens
    uncached = prompt * (1.0 - hit_rate)
    context = prompt + output_tokens / 2
    per_request_ms = (
        cfg.prefill_ms_per_token * uncached
        + cfg.step_base_ms * uncached / cfg.max_num_batched_tokens
        + output_tokens * (cfg.decode_ms_per_seq + cfg.decode_ms_per_1k_context * context / 1000)
    )
    capacity = replicas * 1000.0 / per_request_ms
    wait_s = max(rate - capacity, 0.0) * 0.9 * duration_s / capacity
    own_prefill_ms = cfg.prefill_ms_per_token * uncached + cfg.step_base_ms
    return {
        "hit_rate": round(hit_rate, 4),
        "per_request_ms": round(per_request_ms, 1),
        "capacity_req_s": round(capacity, 2),
        "max_output_tokens_per_s": round(output_tokens * min(rate, capacity), 1),
        "min_ttft_p90_ms": round(wait_s * 1000 + own_prefill_ms, 1),
    }


def min_hit_rate(
    *, max_ttft_p90_ms: float = 0.0, min_output_tokens_per_s: float = 0.0, **wl: Any
) -> float | None:
    """The lowest hit rate at which ``fleet_bounds`` allows both targets (None: not even at 100%)."""

    def ok(h: float) -> bool:
        b = fleet_bounds(hit_rate=h, **wl)
        return (not max_ttft_p90_ms or b["min_ttft_p90_ms"] <= max_ttft_p90_ms) and (
            b["max_output_tokens_per_s"] >= min_output_tokens_per_s
        )

    if not ok(1.0):
        return None
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return round(hi, 3)
