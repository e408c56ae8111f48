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
