"""The shared-prefix hit-rate ceilings: cold groups and new questions miss, a small cache loses more."""

from __future__ import annotations

from bench.hit_ceiling import hit_ceilings

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
