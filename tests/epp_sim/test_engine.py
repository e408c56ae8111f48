"""Tests pinning the engine model: prefix caching, KV pressure, batching limits, LoRA slots, timing."""

from __future__ import annotations

import pytest

from epp_sim.engine import Engine
from epp_sim.lora import Adapter
from epp_sim.sequence import RequestRejected, Seq
from epp_sim.tokens import count_tokens
from tests.epp_sim.helpers import engine_config, finished, make_seq, pause_when, running

LONG = "The quarterly report covers revenue, costs and outlook. " * 300  # 16800 chars = 4200 tokens


def ttft(seq: Seq) -> float:
    """Modelled time to first token, seconds."""
    return seq.first_token_at - seq.arrival


@pytest.mark.parametrize(
    ("second_prompt", "second_adapter", "cached"),
    [
        pytest.param(LONG, None, 4192, id="identical-prompt-reuses-all-but-last-block"),
        pytest.param(LONG[:16000] + "a different question", None, 4000, id="shared-prefix-then-new-tail"),
        pytest.param(LONG, Adapter("other", "/p", 1), 0, id="other-adapter-hashes-differently"),
    ],
)
async def test_repeated_prefix_is_faster_on_the_same_engine_only(
    second_prompt: str, second_adapter: Adapter | None, cached: int
) -> None:
    """A cached prefix skips prefill: the repeat is much faster on the same engine, not on another."""
    same = Engine(engine_config())
    other = Engine(engine_config())
    async with running(same), running(other):
        first = make_seq(LONG)
        same.submit(first)
        await finished(first)
        repeat = make_seq(second_prompt, adapter=second_adapter)
        elsewhere = make_seq(second_prompt, adapter=second_adapter)
        same.submit(repeat)
        other.submit(elsewhere)
        await finished(repeat, elsewhere)
    assert (first.cached_tokens, repeat.cached_tokens, elsewhere.cached_tokens) == (0, cached, 0)
    assert ttft(first) > 0.2  # 4200 uncached tokens at 0.05 ms each, modelled seconds
    assert ttft(elsewhere) > 0.8 * ttft(first)
    if cached:
        assert ttft(repeat) < 0.1 * ttft(first)
        assert same.stats.prefix_hits == cached
    else:
        assert ttft(repeat) > 0.8 * ttft(first)
    assert same.stats.prefix_queries == count_tokens(LONG) + count_tokens(second_prompt)


@pytest.mark.parametrize(
    ("num_gpu_blocks", "running_after_first_step", "waiting_after_first_step"),
    [
        pytest.param(64, 4, 6, id="kv-pressure-queues"),  # 13 blocks per request: 4 fit in 64
        pytest.param(10_000, 10, 0, id="ample-kv-admits-all"),
    ],
)
async def test_kv_pressure_grows_the_queue(
    num_gpu_blocks: int, running_after_first_step: int, waiting_after_first_step: int
) -> None:
    """Requests wait when KV blocks run out although max_num_seqs allows more; all finish later."""
    engine = Engine(engine_config(num_gpu_blocks=num_gpu_blocks))
    engine.faults.paused = True
    seqs = [make_seq(f"{i:04d}" + "x" * 796, max_tokens=8) for i in range(10)]  # 200 prompt tokens each
    for seq in seqs:
        engine.submit(seq)
    reached = pause_when(engine, lambda e: e.stats.steps >= 1)
    async with running(engine):
        engine.faults.paused = False
        engine.wake()
        await reached.wait()
        assert (len(engine.running), len(engine.waiting)) == (
            running_after_first_step,
            waiting_after_first_step,
        )
        assert engine.cache.usage == pytest.approx(running_after_first_step * 13 / num_gpu_blocks)
        engine.faults.paused = False
        engine.wake()
        await finished(*seqs)
    assert all(len(s.output) == 8 and s.finish_reason == "length" for s in seqs)
    assert (len(engine.running), len(engine.waiting), engine.cache.usage) == (0, 0, 0.0)


async def test_decode_preempts_when_blocks_run_out() -> None:
    """Growing sequences that outgrow the cache are preempted (recompute) and still finish exactly."""
    engine = Engine(engine_config(num_gpu_blocks=8))
    seqs = [make_seq(f"{i}" * 192, max_tokens=40) for i in range(2)]  # 48 + 40 tokens = 6 blocks each
    async with running(engine):
        for seq in seqs:
            engine.submit(seq)
        await finished(*seqs)
    assert engine.stats.preemptions >= 1
    assert [len(s.output) for s in seqs] == [40, 40]
    assert engine.cache.usage == 0.0


async def test_max_num_seqs_caps_the_batch() -> None:
    """No more than max_num_seqs sequences run; the rest wait in FCFS order."""
    engine = Engine(engine_config(max_num_seqs=2))
    engine.faults.paused = True
    seqs = [make_seq(f"prompt {i}", max_tokens=4) for i in range(5)]
    for seq in seqs:
        engine.submit(seq)
    reached = pause_when(engine, lambda e: e.stats.steps >= 1)
    async with running(engine):
        engine.faults.paused = False
        engine.wake()
        await reached.wait()
        assert engine.running == seqs[:2]
        assert list(engine.waiting) == seqs[2:]
        engine.faults.paused = False
        engine.wake()
        await finished(*seqs)


async def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    """A prompt longer than max_num_batched_tokens is prefilled in chunks, one per step."""
    engine = Engine(engine_config(max_num_batched_tokens=64))
    steps_at_first_token: list[int] = []
    engine.step_listeners.append(
        lambda e: (
            steps_at_first_token.append(e.stats.steps) if seq.output and not steps_at_first_token else None
        )
    )
    seq = make_seq("y" * 1024, max_tokens=2)  # 256 tokens
    async with running(engine):
        engine.submit(seq)
        await finished(seq)
    assert steps_at_first_token == [4]
    assert ttft(seq) == pytest.approx(4 * (6.0 + 64 * 0.05) / 1000)


async def test_decode_steps_slow_down_with_batch_size() -> None:
    """Inter-token latency grows with the running batch (decode_ms_per_seq and context terms)."""
    itl = {}
    for batch in (1, 64):
        engine = Engine(engine_config())
        seqs = [make_seq(f"{i:03d} batch test prompt", max_tokens=6) for i in range(batch)]
        async with running(engine):
            for seq in seqs:
                engine.submit(seq)
            await finished(*seqs)
        itl[batch] = engine.stats.itl.sum / engine.stats.itl.count
    assert itl[1] == pytest.approx(0.00608, rel=0.01)
    assert itl[64] > itl[1] + 0.004


async def test_adapters_beyond_max_loras_wait() -> None:
    """With max_loras=2, requests for a third adapter wait while two others run; the base model does not."""
    engine = Engine(engine_config(max_loras=2))
    engine.faults.paused = True
    adapters = [Adapter(name, f"/{name}", i + 1) for i, name in enumerate("abc")]
    seqs = [make_seq(f"lora {a.name}", adapter=a, max_tokens=20) for a in adapters]
    base = make_seq("base model request", max_tokens=20)
    for seq in [*seqs, base]:
        engine.submit(seq)
    reached = pause_when(engine, lambda e: e.stats.steps >= 1)
    async with running(engine):
        engine.faults.paused = False
        engine.wake()
        await reached.wait()
        assert (engine.running_loras, engine.waiting_loras) == (("a", "b"), ("c",))
        assert set(engine.running) == {seqs[0], seqs[1], base}
        assert engine.stats.lora_info[("a,b", "c")] > 0
        engine.faults.paused = False
        engine.wake()
        await finished(*seqs, base)
    assert all(len(s.output) == 20 for s in [*seqs, base])
    assert set(engine.slots.resident) == {"c", "b"} or set(engine.slots.resident) == {"c", "a"}


async def test_loading_an_adapter_costs_time() -> None:
    """The first request for a non-resident adapter pays lora_load_ms; the next one does not."""
    engine = Engine(engine_config(lora_load_ms=100.0))
    adapter = Adapter("a", "/a", 1)
    first, second = make_seq("first", adapter=adapter), make_seq("second", adapter=adapter)
    async with running(engine):
        engine.submit(first)
        await finished(first)
        engine.submit(second)
        await finished(second)
    assert ttft(first) > 0.1
    assert ttft(second) < 0.02


@pytest.mark.parametrize(
    ("ignore_eos", "eos_probability", "tokens", "reason"),
    [
        pytest.param(True, 1.0, 10, "length", id="ignore-eos-runs-to-max-tokens"),
        pytest.param(False, 1.0, 1, "stop", id="eos-stops-early"),
        pytest.param(False, 0.0, 10, "length", id="no-eos-drawn"),
    ],
)
async def test_eos_and_ignore_eos(ignore_eos: bool, eos_probability: float, tokens: int, reason: str) -> None:
    """ignore_eos yields exactly max_tokens; otherwise an EOS draw stops the sequence with 'stop'."""
    engine = Engine(engine_config())
    seq = make_seq("eos test", max_tokens=10, ignore_eos=ignore_eos, eos_probability=eos_probability)
    async with running(engine):
        engine.submit(seq)
        await finished(seq)
    assert (len(seq.output), seq.finish_reason) == (tokens, reason)


async def test_abort_frees_blocks_and_keeps_the_cache() -> None:
    """An aborted request releases its blocks at once; its full blocks stay cached for reuse."""
    engine = Engine(engine_config(time_scale=1.0))
    seq = make_seq("z" * 640, max_tokens=1000)
    reached = pause_when(engine, lambda e: e.stats.steps >= 2)
    async with running(engine):
        engine.submit(seq)
        await reached.wait()
        engine.abort(seq)
    assert (seq.finish_reason, engine.cache.usage, engine.stats.success["abort"]) == ("abort", 0.0, 1)
    assert engine.cache.cached_blocks == 10


@pytest.mark.parametrize(
    ("config", "text", "max_tokens", "message"),
    [
        pytest.param(
            {"max_model_len": 100}, "x" * 400, 1, "maximum context length is 100 tokens", id="too-long"
        ),
        pytest.param({"num_gpu_blocks": 2}, "x" * 200, 1, "engine has only 32", id="beyond-kv-capacity"),
        pytest.param({}, "", 1, "cannot be empty", id="empty"),
    ],
)
def test_submit_rejects_impossible_requests(
    config: dict[str, int], text: str, max_tokens: int, message: str
) -> None:
    """Requests that can never run are refused up front instead of waiting forever."""
    engine = Engine(engine_config(**config))
    with pytest.raises(RequestRejected, match=message):
        engine.submit(make_seq(text, max_tokens=max_tokens))


async def test_reset_fails_everything_and_empties_the_cache() -> None:
    """A crash fails in-flight and queued requests with an error and forgets cached blocks and stats."""
    engine = Engine(engine_config(time_scale=1.0, max_num_seqs=1))
    seqs = [make_seq(f"{i}" * 64, max_tokens=1000) for i in range(2)]
    reached = pause_when(engine, lambda e: e.stats.steps >= 2)
    async with running(engine):
        for seq in seqs:
            engine.submit(seq)
        await reached.wait()
        engine.reset("boom")
    assert [(s.finish_reason, s.error) for s in seqs] == [("abort", "boom")] * 2
    assert (engine.cache.cached_blocks, engine.cache.usage, engine.stats.steps) == (0, 0.0, 0)
