"""bench/sync_content: the sender's batches carry its routing, and the receiver applies them all."""

from __future__ import annotations

import pytest

from bench.sync_content import PER_BATCH, run


@pytest.mark.parametrize("per_batch", PER_BATCH)
async def test_every_batch_is_applied_and_the_floor_adds_a_peers_apply_per_peer(per_batch: int) -> None:
    doc = await run(60, 1, per_batch)
    (cell,) = doc["rounds"]
    assert cell["batches"] == 60 // per_batch and cell["bytes_per_batch"] > 0
    assert doc["apply_us_per_peer_request"] > 0
    floor = doc["floor_us_per_request"]
    assert floor["8"] > floor["4"] > floor["2"]
