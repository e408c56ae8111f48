"""bench/tcp_wakes: both modes deliver every message (a low-water mark that stalled reads would
hang the quiet one), and the bound's arithmetic."""

from __future__ import annotations

from bench.tcp_wakes import CAPACITY_PER_BATCH, REQUESTS_PER_BATCH, bound, one


def test_both_modes_move_every_message_and_report_cpu() -> None:
    for quiet in (False, True):
        cell = one(200, quiet)
        assert cell["send_us"] is not None and cell["send_us"] > 0
        assert cell["receive_us"] is not None and cell["receive_us"] > 0


def test_bound_charges_each_peer_a_batch_each_way_per_batch_of_requests() -> None:
    assert bound(4.0, 5.0, 1) == 0.0
    assert bound(4.0, 5.0, 4) == 3 * 9.0 / REQUESTS_PER_BATCH
    assert bound(4.0, 5.0, 8, CAPACITY_PER_BATCH) == 7 * 9.0 / CAPACITY_PER_BATCH
