"""P/D on the engine: the KV-transfer link, remote-prefill decode legs, stalls and interference."""

from __future__ import annotations

from epp.testing.waiting import until
from epp_sim.engine import Engine
from epp_sim.kv_transfer import TransferLink
from epp_sim.sequence import FINISHED, Seq

from .helpers import engine_config, finished, make_seq, running

LONG = "lorem ipsum dolor sit amet " * 300  # ~2,000 simulator tokens


def _seq(tokens: int) -> Seq:
    return make_seq("x" * (tokens * 4))


def test_concurrent_transfers_share_the_bandwidth() -> None:
    alone = TransferLink(ms_per_token=0.01, base_ms=0.0, timeout_s=60.0)
    alone.start(_seq(1000), 1000, 0.0)
    shared = TransferLink(ms_per_token=0.01, base_ms=0.0, timeout_s=60.0)
    shared.start(_seq(1000), 1000, 0.0)
    shared.start(_seq(1000), 1000, 0.0)
    t_alone = alone.next_event(0.0, stalled=False)
    t_shared = shared.next_event(0.0, stalled=False)
    assert t_alone is not None and t_shared is not None
    assert t_shared > t_alone * 1.9
    done, _ = shared.advance(t_alone, stalled=False)
    assert done == []  # half-way for both
    done, _ = shared.advance(t_shared, stalled=False)
    assert len(done) == 2


def test_a_short_transfer_leaves_the_bandwidth_to_the_long_one() -> None:
    link = TransferLink(ms_per_token=0.01, base_ms=0.0, timeout_s=60.0)
    short, long = _seq(100), _seq(1000)
    link.start(short, 100, 0.0)
    link.start(long, 1000, 0.0)
    first = link.next_event(0.0, stalled=False)
    assert first is not None
    assert link.advance(first, stalled=False)[0] == [short]
    last = link.next_event(first, stalled=False)
    assert last is not None
    assert link.advance(last, stalled=False)[0] == [long]
    assert last < (1100 * 0.01 + 1) / 1000  # alone after the short one finished, not shared to the end


def test_a_stalled_link_times_out() -> None:
    link = TransferLink(ms_per_token=0.01, base_ms=0.0, timeout_s=2.0)
    seq = _seq(100)
    link.start(seq, 100, 0.0)
    assert link.next_event(0.0, stalled=True) == 2.0
    assert link.advance(1.0, stalled=True) == ([], [])
    assert link.advance(2.0, stalled=True) == ([], [seq])


async def test_remote_prefill_replaces_prefill_compute_by_the_transfer() -> None:
    config = engine_config(kv_transfer_ms_per_token=0.001, prefill_ms_per_token=0.05)
    local, remote = Engine(config), Engine(config)
    a, b = make_seq(LONG, max_tokens=2), make_seq(LONG, max_tokens=2)
    b.remote_prefill = True
    async with running(local), running(remote):
        local.submit(a)
        remote.submit(b)
        await finished(a, b)
    assert a.error is None and b.error is None
    assert len(b.output) == 2
    assert remote.stats.kv_transfers == 1 and local.stats.kv_transfers == 0
    transfer_s = (config.kv_transfer_base_ms + b.prompt_len * config.kv_transfer_ms_per_token) / 1000
    ttft_remote = b.first_token_at - b.arrival
    assert ttft_remote >= transfer_s
    assert ttft_remote < a.first_token_at - a.arrival  # no prefill compute on the decode side


async def test_blocks_are_held_while_the_kv_arrives() -> None:
    engine = Engine(engine_config(kv_transfer_ms_per_token=0.5))  # a slow link: 1 modelled s
    seq = make_seq(LONG, max_tokens=1)
    seq.remote_prefill = True
    async with running(engine):
        engine.submit(seq)
        await until(lambda: bool(engine.link.active), what="transfer started")
        held = engine.cache.num_blocks - engine.cache.free_blocks
        state = engine.snapshot()
        await finished(seq)
    assert held >= seq.prompt_len // engine.config.block_size
    assert state["kv_transfers_in_flight"] == 1 and state["running"] == 0
    assert seq.error is None
    assert engine.snapshot()["kv_transfers"] == 1


async def test_a_stalled_transfer_fails_with_a_clear_error() -> None:
    engine = Engine(engine_config(kv_transfer_timeout_s=0.5))
    engine.faults.kv_transfer_stall = True
    seq = make_seq(LONG, max_tokens=4)
    seq.remote_prefill = True
    async with running(engine):
        engine.submit(seq)
        await finished(seq)
    assert seq.state == FINISHED
    assert seq.error is not None and "KV transfer" in seq.error and "0.5 s" in seq.error
    assert engine.stats.kv_transfer_failures == 1
    assert engine.cache.free_blocks == engine.cache.num_blocks  # its blocks came back


async def test_a_prefill_in_the_batch_slows_every_decode_down() -> None:
    """The interference P/D removes: a decode sharing a step with a prefill chunk waits for it."""
    engine = Engine(engine_config())
    decoding = make_seq("short prompt", max_tokens=40, stream=True)
    gaps: list[float] = []
    async with running(engine):
        engine.submit(decoding)
        while len(decoding.output) < 5:
            await decoding.wait()
            decoding.delivered = len(decoding.output)
        quiet_from = decoding.last_token_at
        quiet_tokens = len(decoding.output)
        engine.submit(make_seq(LONG, max_tokens=1))
        last, count = decoding.last_token_at, len(decoding.output)
        while not decoding.finished:
            await decoding.wait()
            decoding.delivered = len(decoding.output)
            if len(decoding.output) > count:
                gaps.append((decoding.last_token_at - last) / (len(decoding.output) - count))
                last, count = decoding.last_token_at, len(decoding.output)
    quiet_itl = (last - quiet_from) / max(1, count - quiet_tokens)
    assert max(gaps) > 5 * min(gaps)
    assert max(gaps) > quiet_itl


async def test_a_request_waiting_for_kv_counts_as_waiting() -> None:
    """vLLM counts WAITING_FOR_REMOTE_KVS requests in num_requests_waiting; the EPP's queue scorer sees them."""
    engine = Engine(engine_config(kv_transfer_ms_per_token=0.5))
    seq = make_seq(LONG, max_tokens=1)
    seq.remote_prefill = True
    async with running(engine):
        engine.submit(seq)
        await until(lambda: bool(engine.link.active), what="transfer started")
        assert engine.num_waiting == 1 and not engine.waiting
        await finished(seq)
    assert engine.num_waiting == 0
