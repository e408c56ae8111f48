"""bench/scaleout's pieces: the pre-encoded ext_proc client against a real EPP, and its metric reading."""

from __future__ import annotations

import pytest

from bench import extproc_client as xc
from bench.scaleout import histogram_quantile, peer_args, sample_sum
from epp_sim.demo.procs import EppProcess, SimFleet

HIST = """\
# TYPE epp_sync_delta_lag_seconds histogram
epp_sync_delta_lag_seconds_bucket{peer="a",le="0.001"} 50
epp_sync_delta_lag_seconds_bucket{peer="a",le="0.01"} 90
epp_sync_delta_lag_seconds_bucket{peer="a",le="+Inf"} 100
epp_sync_delta_lag_seconds_bucket{peer="b",le="0.001"} 50
epp_sync_delta_lag_seconds_bucket{peer="b",le="0.01"} 100
epp_sync_delta_lag_seconds_bucket{peer="b",le="+Inf"} 100
epp_sync_batches_received_total{peer="a"} 7
epp_sync_batches_received_total{peer="b"} 5
"""


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.25, 0.0005), (0.5, 0.001), (0.7, 0.001 + 0.009 * (40 / 90)), (0.99, 0.01)],
)
def test_histogram_quantile_sums_the_series_and_interpolates(q: float, expected: float) -> None:
    assert histogram_quantile(HIST, "epp_sync_delta_lag_seconds", q) == pytest.approx(expected)


def test_histogram_quantile_of_a_missing_family_is_none() -> None:
    assert histogram_quantile(HIST, "nope", 0.5) is None


def test_sample_sum_adds_every_series() -> None:
    assert sample_sum(HIST, "epp_sync_batches_received_total") == 12


def test_peer_args_name_every_other_replica() -> None:
    args = peer_args(1, [9001, 9002, 9003])
    assert "--peer-port=9002" in args
    assert "--peers=127.0.0.1:9001,127.0.0.1:9003" in args


@pytest.mark.e2e
async def test_the_client_routes_and_tells_refusals_from_failures() -> None:
    async with (
        SimFleet(2, "--time-scale", "0.02") as fleet,
        EppProcess(f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1") as epp,
    ):
        good = xc.variants(["hello world"] * 4, "mock-model")
        st = await xc.open_loop("127.0.0.1", epp.grpc_port, good, rate=100, seconds=0.5)
        assert (st.routed, st.refused, st.failed) == (50, 0, 0)
        assert len(st.latencies) == 50
        bad = xc.variants(['broken "json'], "mock-model")  # the EPP answers 400 itself
        st = await xc.closed_loop("127.0.0.1", epp.grpc_port, bad, connections=1, concurrency=2, seconds=0.3)
        assert st.refused > 0
        assert st.routed == 0
        assert st.failed == 0


def test_a_lone_replica_lists_itself_so_its_hub_runs_with_no_peers() -> None:
    assert "--peers=127.0.0.1:9001" in peer_args(0, [9001])
