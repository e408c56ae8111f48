"""The shared-prefix hit-rate ceilings: cold groups and new questions miss, a small cache loses more."""

from __future__ import annotations

from bench.hit_ceiling import fleet_bounds, hit_ceilings, min_hit_rate

SHAPE = {
    "groups": 4,
    "prompts_per_group": 3,
    "system_tokens": 64,
    "question_tokens": 32,
    "output_tokens": 16,
    "block_size": 16,
    "replicas": 2,
}


def test_unbounded_counts_only_cold_groups_and_new_questions() -> None:
    # 12 requests, each prompt once: 4 cold, 8 reuse the 4-block system prompt of 6 blocks
    c = hit_ceilings(**SHAPE, kv_blocks=10_000, requests=12)
    assert c["unbounded"] == round(8 * 64 / (12 * 96), 4)
    assert c["perfect_placement"] == c["unbounded"]  # everything fits: placement loses nothing


def test_a_cache_smaller_than_the_groups_loses_prefixes() -> None:
    small = hit_ceilings(**SHAPE, kv_blocks=8, requests=12)
    assert small["perfect_placement"] < small["unbounded"]


def test_repeated_prompts_hit_their_question_too() -> None:
    once = hit_ceilings(**SHAPE, kv_blocks=10_000, requests=12)["unbounded"]
    twice = hit_ceilings(**SHAPE, kv_blocks=10_000, requests=24)["unbounded"]
    # the second lap hits all but the last block of every prompt: 5 of 6 blocks
    assert twice == round((8 * 64 + 12 * 80) / (24 * 96), 4)
    assert twice > once


BENCH = {
    "system_tokens": 6000,
    "question_tokens": 1200,
    "output_tokens": 100,
    "replicas": 8,
    "duration_s": 30,
}


def test_fleet_bounds_follow_the_simulators_time_model() -> None:
    """One request at no hit: 7,200 tokens x 0.05 ms + 6 ms x 7,200/8,192 + 100 decodes at
    0.08 + 0.04 x 7.25 ms; below capacity the TTFT bound is the own prefill, above it the queue."""
    from epp_sim.config import EngineConfig

    cfg = EngineConfig()
    b = fleet_bounds(rate=1.0, hit_rate=0.0, **BENCH)
    per = (
        7200 * cfg.prefill_ms_per_token
        + cfg.step_base_ms * 7200 / cfg.max_num_batched_tokens
        + 100 * (cfg.decode_ms_per_seq + cfg.decode_ms_per_1k_context * 7.25)
    )
    assert b["per_request_ms"] == round(per, 1)
    assert b["capacity_req_s"] == round(8000 / per, 2)
    assert b["max_output_tokens_per_s"] == 100.0  # the offered rate
    assert b["min_ttft_p90_ms"] == round(7200 * cfg.prefill_ms_per_token + cfg.step_base_ms, 1)
    over = fleet_bounds(rate=40.0, hit_rate=0.0, **BENCH)
    assert abs(over["max_output_tokens_per_s"] - 100 * over["capacity_req_s"]) < 1  # C x 100
    assert over["min_ttft_p90_ms"] > 10_000  # (40 - C) x 27 s / C of queue first


def test_more_hits_raise_the_bound_and_min_hit_rate_inverts_it() -> None:
    lo, hi = (fleet_bounds(rate=40.0, hit_rate=h, **BENCH) for h in (0.4, 0.6))
    assert hi["max_output_tokens_per_s"] > lo["max_output_tokens_per_s"]
    assert hi["min_ttft_p90_ms"] < lo["min_ttft_p90_ms"]
    need = min_hit_rate(rate=40.0, min_output_tokens_per_s=lo["max_output_tokens_per_s"], **BENCH)
    assert need is not None and abs(need - 0.4) < 0.01
    assert min_hit_rate(rate=40.0, min_output_tokens_per_s=5000.0, **BENCH) is None  # above the offered rate
