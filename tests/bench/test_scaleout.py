"""bench/scaleout's pieces: the pre-encoded ext_proc client against a real EPP, and its metric reading."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench import extproc_client as xc
from bench.scaleout import (
    CONFIG,
    QUICK,
    QueueSampler,
    crowding_summary,
    dedicated_ratio,
    histogram_quantile,
    interval_config,
    lopsided,
    median_cell,
    peer_args,
    rps_at_p99,
    sample_sum,
    summarise,
    uncrowded_cell,
    uncrowded_summary,
)
from epp.config.load import load_config
from epp_sim.demo.procs import EppProcess, SimFleet
from tests.e2e.conftest import QUICK_STOP

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


def test_histogram_quantile_minus_an_earlier_page_reads_what_was_observed_since() -> None:
    earlier = HIST.replace('le="0.01"} 90', 'le="0.01"} 50').replace('le="+Inf"} 100', 'le="+Inf"} 50', 1)
    earlier = earlier.replace('peer="b",le="0.01"} 100', 'peer="b",le="0.01"} 50')
    earlier = earlier.replace('peer="b",le="+Inf"} 100', 'peer="b",le="+Inf"} 50')
    # since then: peer a 40 in (0.001, 0.01] and 10 above; peer b nothing (every bucket 50 -> 50 ... 100)
    q = histogram_quantile(HIST, "epp_sync_delta_lag_seconds", 0.5, minus=earlier)
    assert q == pytest.approx(0.001 + 0.009 * (50 / 90))
    assert histogram_quantile(HIST, "epp_sync_delta_lag_seconds", 0.5, minus=HIST) is None  # nothing since


def test_histogram_quantile_of_a_missing_family_is_none() -> None:
    assert histogram_quantile(HIST, "nope", 0.5) is None


def test_sample_sum_adds_every_series() -> None:
    assert sample_sum(HIST, "epp_sync_batches_received_total") == 12


def test_peer_args_name_every_other_replica() -> None:
    args = peer_args(1, [9001, 9002, 9003])
    assert "--peer-port=9002" in args
    assert "--peers=127.0.0.1:9001,127.0.0.1:9003" in args


async def test_queue_sampler_averages_the_fleets_and_the_longest_queue_over_the_reads() -> None:
    q = QueueSampler([1, 2, 3, 4])
    q.samples = [[0, 0, 0, 0], [1, 1, 1, 1], [4, 0, 0, 0], [3, 1, 0, 0]]  # idle, even, a herd, between
    assert await q.stop() == {"samples": 4, "waiting_mean": 3.0, "longest_mean": 2.0}


async def test_queue_sampler_without_a_read_reports_none() -> None:
    assert await QueueSampler([1]).stop() == {"samples": 0, "waiting_mean": None, "longest_mean": None}


def run(ttft: float, hits: float, *, engine: float | None = 500.0) -> dict[str, object]:
    return {
        "replicas": 4,
        "sync": True,
        "ttft_p90_ms": ttft,
        "ttft_p50_ms": ttft / 2,
        "prefix_hit_rate": hits,
        "success_rate": 1.0,
        "engine_ttft_p90_ms": engine,
        "engine_queue_p90_ms": None,
        "schedule_p90_ms": 0.2,
        "sim_cpu_s": 3.0,
        "queues": {"waiting_mean": 3.0, "longest_mean": 2.0},
    }


def test_median_cell_takes_each_figures_median_and_range_over_the_repeats() -> None:
    cell = median_cell([run(900, 0.40), run(700, 0.38, engine=None), run(1900, 0.41)])
    assert cell["repeats"] == 3
    assert cell["ttft_p90_ms"] == 900
    assert cell["ttft_p90_ms_range"] == [700, 1900]
    assert cell["prefix_hit_rate"] == 0.40
    assert cell["engine_ttft_p90_ms"] == 500.0  # a run without the figure is left out
    assert cell["engine_queue_p90_ms"] is None and cell["engine_queue_p90_ms_range"] is None
    assert cell["waiting_mean"] == 3.0 and cell["longest_mean"] == 2.0
    assert len(cell["runs"]) == 3


def cost_round(n: int, sync: bool, cpu: float, p99: float = 2.0, lag: float | None = None) -> dict[str, Any]:
    return {
        "replicas": n,
        "sync": sync,
        "cpu_us_per_request": cpu,
        "p99_ms": p99,
        "staleness_p99_ms": lag,
        "failed": 0,
        "sent_per_request": 1.0 if sync else None,
    }


def test_a_rates_cost_summary_takes_medians_scales_against_one_alone_and_flags_overload() -> None:
    runs = {
        (1, False): [cost_round(1, False, 300), cost_round(1, False, 320), cost_round(1, False, 900)],
        (4, False): [cost_round(4, False, 400)] * 3,
        (4, True): [
            cost_round(4, True, 600, lag=4.0),
            cost_round(4, True, 640, lag=12.0),
            cost_round(4, True, 620, p99=30, lag=5.0),
        ],
    }
    out = summarise(runs)
    one, off, on = out["cells"]
    assert one["cpu_us_per_request"] == 320 and on["cpu_us_per_request"] == 620
    assert out["effective_scaling"] == {"4": round(4 * 320 / 620, 2)}
    assert out["sync_on_vs_off_same_n"] == {"4": round(620 / 400, 2)}
    assert out["sync_off_vs_alone"] == {"1": 1.0, "4": round(400 / 320, 2)}
    assert out["staleness_p99_ms_worst"] == 5.0  # the median round's, not the worst round's
    assert on["sent_per_request"] == 1.0 and off["sent_per_request"] is None
    assert out["overloaded_cells"] == [] and on["p99_ms"] == 2.0
    assert out["met"] == {"scaling_4": False, "scaling_8": False, "staleness": True}
    runs[(4, True)] = [cost_round(4, True, 600, p99=30)] * 3
    assert summarise(runs)["overloaded_cells"] == ["4 on"]
    assert "uncrowded" not in out


def test_the_uncrowded_cells_scale_against_one_alone_with_replica_0s_staleness() -> None:
    runs = {(1, False): [cost_round(1, False, 300)] * 3, (4, True): [cost_round(4, True, 900, lag=8.0)] * 3}
    replayed = {
        4: [
            cost_round(4, True, 400, lag=6.0),
            cost_round(4, True, 420, lag=7.0),
            cost_round(4, True, 500, lag=30),
        ],
        8: [cost_round(8, True, 600, p99=40, lag=9.0)] * 3,
    }
    for rounds in replayed.values():
        for r in rounds:
            r["replayer_cpu_s"] = 1.0
    out = summarise(runs, replayed)
    assert out["effective_scaling"] == {"4": round(4 * 300 / 900, 2)}  # the crowded figure stays as it was
    un = out["uncrowded"]
    four, eight = un["cells"]
    assert eight["overloaded"] and not four["overloaded"]
    assert (
        four["cpu_us_per_request"] == 420
        and four["staleness_p99_ms"] == 7.0
        and four["replayer_cpu_s"] == 1.0
    )
    assert un["effective_scaling"] == {"4": round(4 * 300 / 420, 2), "8": 4.0}
    assert un["sync_on_vs_alone"] == {"4": 1.4, "8": 2.0}
    assert un["staleness_p99_ms_worst"] == 9.0 and un["overloaded_cells"] == ["8"]
    assert un["met"] == {"scaling_4": False, "scaling_8": False, "staleness": True}


@pytest.mark.e2e
async def test_an_uncrowded_cell_replays_the_peers_one_replica_hears() -> None:
    """One EPP and a replayed peer (bench/scaleout_peers, its own process): replica 0 receives
    about one batch per request from it, and the replayer made its requests on the same schedule."""
    st = dataclasses.replace(QUICK, cost_seconds=1.5)
    cell = await uncrowded_cell(2, st, rate=40.0)
    assert cell["routed"] == 60 and cell["failed"] == 0
    assert cell["replayed_requests"] == 60 and cell["replayed_batches_sent"] >= 50
    assert cell["received_per_request"] is not None and cell["received_per_request"] >= 0.8
    assert cell["staleness_p99_ms"] is not None and cell["replayer_cpu_s"] > 0


def test_the_sync_s_own_cost_is_each_round_s_synced_cell_less_its_control() -> None:
    """The control runs the same replayer beside replica 0 with sync off: per round, the sync's own
    cost is the difference of the two cells (medians over rounds of the differences, not the
    difference of medians), and the scaling it implies is N x cost(1) / (cost(1) + that)."""
    replayed = {2: [cost_round(2, True, c) for c in (280, 300, 290)], 4: [cost_round(4, True, 330)] * 3}
    beside = {2: [cost_round(2, False, c) for c in (250, 230, 270)], 4: [cost_round(4, False, 260)] * 3}
    out = crowding_summary(200.0, replayed, beside)
    assert out["sync_own_us_per_request"] == {"2": 30.0, "4": 70.0}  # differences 30, 70, 20
    assert out["scaling_without_crowding_estimate"] == {
        "2": round(2 * 200 / 230, 2),
        "4": round(4 * 200 / 270, 2),
    }
    assert out["controls"]["vs_alone"] == {"2": 1.25, "4": 1.3}
    assert [c["replicas"] for c in out["controls"]["cells"]] == [2, 4]
    assert crowding_summary(None, replayed, beside)["scaling_without_crowding_estimate"] == {
        "2": None,
        "4": None,
    }


def test_an_interval_cell_reads_the_same_plugins_with_llm_d_s_sync_interval(tmp_path: Path) -> None:
    """``--sync-interval``: replica 0's config is CONFIG in llm-d-router's layout (whose
    ``dataLayer`` needs no sources) with ``crossReplicaSyncInterval`` set, the same plugins and
    profiles."""
    config = load_config(interval_config(tmp_path, 0.006).read_text())
    base = load_config(CONFIG.read_text())
    assert config.data_layer is not None and config.data_layer.cross_replica_sync_interval == 0.006
    assert [p.type for p in base.plugins] == [p.type for p in config.plugins][: len(base.plugins)]
    assert config.scheduling_profiles == base.scheduling_profiles


@pytest.mark.e2e
async def test_an_interval_cell_caps_both_sides_batches_at_one_an_interval() -> None:
    """With ``sync_interval`` 20 ms at 200 requests a second, replica 0 and its replayed peer each
    send at most one batch per interval (a quarter of a batch a request; without it a request
    this far from the next is a batch of its own), and replica 0 still applies the peer's."""
    st = dataclasses.replace(QUICK, cost_seconds=1.5, sync_interval=0.02)
    cell = await uncrowded_cell(2, st, rate=200.0)
    assert cell["routed"] == 300 and cell["failed"] == 0
    assert cell["sent_per_request"] is not None and 0.1 <= cell["sent_per_request"] <= 0.3
    assert cell["replayed_sent_per_request"] is not None and cell["replayed_sent_per_request"] <= 0.3
    assert cell["received_per_request"] is not None and cell["received_per_request"] >= 0.1


@pytest.mark.e2e
async def test_the_control_cell_runs_the_replayer_beside_a_replica_that_hears_none_of_it() -> None:
    """``uncrowded_cell(sync=False)``: the replayer routes and publishes on its schedule, but
    replica 0 has sync off: it receives no batch and sends none."""
    st = dataclasses.replace(QUICK, cost_seconds=1.5)
    cell = await uncrowded_cell(2, st, rate=40.0, sync=False)
    assert cell["sync"] is False and cell["routed"] == 60 and cell["failed"] == 0
    assert cell["replayed_requests"] == 60 and cell["replayed_batches_sent"] >= 50
    assert cell["batches_received"] == 0 and cell["batches_sent"] == 0
    assert cell["received_per_request"] is None and cell["replayer_cpu_s"] > 0


@pytest.mark.e2e
async def test_the_client_routes_and_tells_refusals_from_failures() -> None:
    async with (
        SimFleet(2, "--time-scale", "0.02") as fleet,
        EppProcess(f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1", QUICK_STOP) as epp,
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


class _Sink:
    """A transport that keeps what the client writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _frames(data: bytes) -> list[tuple[int, int, int]]:
    """(type, flags, stream) of every frame in ``data`` after the preface's."""
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big")))
        pos += 9 + length
    return out


def _reply(sid: int, message: bytes) -> bytes:
    """What the EPP sends on a stream: response headers, one gRPC message, trailers."""
    return (
        xc.frame(xc.HEADERS, xc.END_HEADERS, sid, b"\x88")  # :status 200
        + xc.frame(xc.DATA, 0, sid, message)
        + xc.frame(xc.HEADERS, xc.END_HEADERS | xc.END_STREAM, sid, b"\x88")  # trailers
    )


async def test_a_closed_loop_stream_is_answered_and_replaced_even_byte_by_byte_and_in_one_write() -> None:
    vs = xc.variants(["hello"], "m")
    loop = xc.ClosedLoop(vs, deadline=float("inf"))
    conn = xc.Connection(xc.header_block("x"), loop)
    sink = _Sink()
    conn.connection_made(sink)  # type: ignore[arg-type]
    loop.open = 1
    conn.start(vs[0], None)
    assert _frames(sink.writes[-1]) == [(xc.HEADERS, xc.END_HEADERS, 1), (xc.DATA, 0, 1)]
    reply = b"\x00\x00\x00\x00\x02\x0a\x00"  # a gRPC message: ProcessingResponse.request_headers
    server = _reply(1, reply)
    before = len(sink.writes)
    for i in range(len(server)):
        conn.data_received(server[i : i + 1])
    written = b"".join(sink.writes[before:])
    # the second phase of stream 1 (END_STREAM), then its replacement, stream 3
    assert _frames(written) == [
        (xc.DATA, xc.END_STREAM, 1),
        (xc.HEADERS, xc.END_HEADERS, 3),
        (xc.DATA, 0, 3),
    ]
    assert (loop.stats.routed, loop.stats.refused, loop.stats.failed) == (1, 0, 0)
    assert conn.open_streams == 1
    # a whole reply in one read: the second phase and the replacement leave in one write
    before = len(sink.writes)
    conn.data_received(_reply(3, reply))
    assert len(sink.writes) == before + 1
    assert _frames(sink.writes[-1]) == [
        (xc.DATA, xc.END_STREAM, 3),
        (xc.HEADERS, xc.END_HEADERS, 5),
        (xc.DATA, 0, 5),
    ]


async def test_a_closed_loop_stops_replacing_at_its_deadline_and_counts_a_refusal() -> None:
    vs = xc.variants(["hello"], "m")
    loop = xc.ClosedLoop(vs, deadline=0.0)  # already over: nothing is replaced
    conn = xc.Connection(xc.header_block("x"), loop)
    conn.connection_made(_Sink())  # type: ignore[arg-type]
    loop.open = 1
    conn.start(vs[0], None)
    refused = b"\x00\x00\x00\x00\x02\x3a\x00"  # ProcessingResponse.immediate_response
    conn.data_received(_reply(1, refused))
    assert (loop.stats.routed, loop.stats.refused) == (0, 1)
    assert loop.finished.done()
    assert conn.open_streams == 0


def test_the_dedicated_machine_ratio_charges_the_client_and_simulators_to_two_workers() -> None:
    rounds = [{"one": {"rps_per_epp_core": 5000.0}, "two": {"rps_per_epp_core": 5000.0}}]
    # free client and simulators: two workers route twice one's
    assert dedicated_ratio(rounds, 0.0, 0.0) == 2.0
    # 20 us per request and 0.04 simulator cores: (2 - 0.04) x 5000 / (1 + 0.1) / 5000
    assert dedicated_ratio(rounds, 20.0, 0.04) == pytest.approx(1.96 / 1.1, abs=1e-3)
    assert dedicated_ratio(rounds, None, 0.04) is None


def test_a_lone_replica_lists_itself_so_its_hub_runs_with_no_peers() -> None:
    assert "--peers=127.0.0.1:9001" in peer_args(0, [9001])


def test_an_uncrowded_cell_whose_replayer_fell_behind_is_overloaded() -> None:
    """The replayed peers run the same hub on the same schedule as replica 0: sending under half
    its batches per request (their timers ran late on a starved machine), or using nearly a core,
    they no longer model N - 1 peers, and the cell says so."""

    def cell(n: int, replayed_sent: float, cores: float) -> dict[str, Any]:
        return {"replicas": n, "cpu_us_per_request": 250.0, "p99_ms": 4.0, "staleness_p99_ms": 6.0,
                "failed": 0, "sent_per_request": 0.3, "replayed_sent_per_request": replayed_sent,
                "replayer_cores": cores, "replayer_cpu_s": cores * 8}  # fmt: skip

    s = uncrowded_summary(200.0, {2: [cell(2, 0.31, 0.2)], 4: [cell(4, 0.1, 0.4)], 8: [cell(8, 0.3, 0.95)]})
    assert s["overloaded_cells"] == ["4", "8"]


def _cell(streams: int, p99_ms: float, rps: float) -> dict[str, Any]:
    return {"streams": streams, "p99_ms": p99_ms, "rps": rps}


def test_the_rate_at_a_p99_is_read_on_the_line_between_the_cells_that_bracket_it() -> None:
    cells = [_cell(64, 8.0, 20000.0), _cell(96, 12.0, 22000.0), _cell(128, 16.0, 23000.0)]
    assert rps_at_p99(cells, 10.0) == {"rps": 21000.0, "how": "interpolated", "between_streams": [64, 96]}
    assert rps_at_p99(cells, 15.0)["rps"] == 22750.0
    assert rps_at_p99(cells, 8.0)["rps"] == 20000.0  # on a cell: that cell's rate
    # past every cell's p99: the most measured, as a floor; faster than any: no reading
    assert rps_at_p99(cells, 30.0) == {"rps": 23000.0, "how": "at least"}
    assert rps_at_p99(cells, 5.0) == {"rps": None, "how": "below the cells"}
    # the cells in any order, a noisy p99 that is not monotonic in the streams included
    noisy = [_cell(128, 11.0, 23000.0), _cell(64, 8.0, 20000.0), _cell(96, 12.0, 22000.0)]
    assert rps_at_p99(noisy, 9.5)["between_streams"] == [64, 128]


def test_a_cell_whose_connections_hashed_onto_one_worker_is_lopsided() -> None:
    one_worker = {"client": 0.05, "worker0": 1.0}
    assert not lopsided(one_worker)  # nothing to compare with
    assert lopsided({"client": 0.05, "sim": 0.01, "worker0": 1.001, "worker1": 0.016})
    assert not lopsided({"worker0": 0.93, "worker1": 0.89, "supervisor": 0.0})
    assert not lopsided({"worker0": 0.9, "worker1": 0.3})  # uneven, both routing: a real result
