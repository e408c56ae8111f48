"""The simulated engine: vLLM-V1-style continuous batching over a paged, prefix-cached KV cache."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from epp_sim.config import EngineConfig, Faults
from epp_sim.hashing import BlockHasher, external_hash
from epp_sim.kv_cache import KVCache
from epp_sim.kv_events import KVEventPublisher
from epp_sim.kv_transfer import TransferLink
from epp_sim.lora import LoraSlots
from epp_sim.sequence import FINISHED, RUNNING, TRANSFERRING, WAITING, RequestRejected, Seq
from epp_sim.stats import EngineStats
from epp_sim.timing import StepWork, TimeModel
from epp_sim.tokens import VOCAB_IDS

_MAX_LAG_S: Final = 0.02  # a late step is caught up by shortening later ones, at most this much


@dataclass(slots=True)
class _Step:
    start: float  # model time the step starts
    scheduled: list[tuple[Seq, int]]
    work: StepWork


class Engine:
    """One engine (one DP rank). `run()` is its scheduler loop; `submit`/`abort` come from the servers.

    Each step: schedule running sequences (decode 1 token or the next prefill chunk; preempt the newest
    when KV blocks run out), then admit waiting ones FCFS within max_num_seqs, max_num_batched_tokens,
    free blocks and max_loras; sleep the modelled step time x time_scale; then commit: newly full
    blocks are cached, every sequence whose prompt is computed samples one token.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        faults: Faults | None = None,
        rank: int = 0,
        publisher: KVEventPublisher | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.faults = faults or Faults()
        self.publisher = publisher
        self.time_model = TimeModel.from_config(config)
        self.cache = KVCache(config.num_gpu_blocks, config.block_size, record_events=publisher is not None)
        self.hasher = self._new_hasher()
        self.slots = LoraSlots(config.max_loras)
        self.stats = EngineStats()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.link = TransferLink(
            config.kv_transfer_ms_per_token, config.kv_transfer_base_ms, config.kv_transfer_timeout_s
        )
        self._running_loras: Counter[str] = Counter()
        self._waiting_loras: Counter[str] = Counter()
        self._inv_scale = 1.0 / config.time_scale
        # the modelled clock: model time _m0 at wall time _w0, or inside the step now running
        self._m0 = 0.0
        self._w0 = time.monotonic()
        self._inflight: tuple[float, float, float] | None = None  # (model start, wall start, model length)
        self._wake_wall = self._w0  # when the idle engine was last woken: a step starts then, in model time
        self._rng = random.Random(config.seed * 1_000_003 + rank)
        self._wake = asyncio.Event()
        # called after every step; tests use it to freeze the engine (faults.paused) at a chosen state
        self.step_listeners: list[Callable[[Engine], None]] = []

    # ---- serving side -------------------------------------------------------------------------

    def submit(self, seq: Seq) -> None:
        config = self.config
        if seq.prompt_len == 0:
            raise RequestRejected("The prompt cannot be empty.")
        total = seq.prompt_len + (0 if seq.embedding else seq.max_tokens)
        if total > config.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {config.max_model_len} tokens. However, you "
                f"requested {total} tokens ({seq.prompt_len} in the messages, {seq.max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        if -(-total // config.block_size) > config.num_gpu_blocks:
            raise RequestRejected(
                f"The request needs {total} tokens of KV cache but the engine has only "
                f"{config.num_gpu_blocks * config.block_size} (num_gpu_blocks={config.num_gpu_blocks})."
            )
        bs = config.block_size
        tokens = seq.tokens
        block = self.hasher.block
        digest = None
        for start in range(0, seq.prompt_len - bs + 1, bs):
            digest = block(digest, tokens[start : start + bs], seq.extra if start else seq.first_extra)
            seq.hashes.append(external_hash(digest))
        seq.last_digest = digest
        wall = time.monotonic()
        seq.arrival = self.model_time(wall)
        self.waiting.append(seq)
        if seq.adapter is not None:
            self._waiting_loras[seq.adapter.name] += 1
        self.wake(wall)

    def abort(self, seq: Seq) -> None:
        """Drop a sequence the client gave up on; its cached blocks stay cached."""
        if seq.state == WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                return
            self._forget_waiting_lora(seq)
        elif seq.state == RUNNING:
            self.cache.release(seq.held)
            seq.held = []
            self.running.remove(seq)
            self._forget_running_lora(seq)
        elif seq.state == TRANSFERRING:
            self.link.remove(seq)
            self._release(seq)
        else:
            return
        self._finish(seq, "abort", self.model_time())

    def reset(self, error: str) -> None:
        """A crash: fail every sequence with `error`, empty the KV cache and GPU slots, zero the stats.

        The process died: nothing is published (a crashed vLLM sends no AllBlocksCleared), and the
        restarted engine draws a new NONE_HASH and counts its event sequence from 0 again.
        """
        now = self.model_time()
        for seq in [*self.running, *self.waiting, *(t.seq for t in self.link.active)]:
            seq.error = error
            self._finish(seq, "abort", now, record=False)
        self.link.active.clear()
        self.running.clear()
        self.waiting.clear()
        self._running_loras.clear()
        self._waiting_loras.clear()
        self.cache.clear()
        self.cache.take_events()
        self.slots.clear()
        self.stats = EngineStats()
        self.hasher = self._new_hasher()
        if self.publisher is not None:
            self.publisher.restart()

    def _new_hasher(self) -> BlockHasher:
        """The hash the engine process starts with: the configured one, or the restart fault's."""
        f, c = self.faults, self.config
        seed = f.restart_hash_seed if f.restart_hash_seed is not None else c.hash_seed
        return BlockHasher(f.restart_hash_algo or c.prefix_caching_hash_algo, seed)

    def reset_prefix_cache(self) -> bool:
        """vLLM's POST /reset_prefix_cache: drop every cached block (AllBlocksCleared); False while
        a sequence holds blocks, as vLLM refuses then."""
        if self.running:
            return False
        self.cache.clear()
        self._flush_events()
        return True

    def wake(self, wall: float | None = None) -> None:
        """Make an idle engine look for work; `wall` (monotonic) is when, by default now."""
        if not self._wake.is_set():
            self._wake_wall = time.monotonic() if wall is None else wall
            self._wake.set()

    # ---- scheduler loop -----------------------------------------------------------------------

    def model_time(self, wall: float | None = None) -> float:
        """Modelled seconds since the engine started: wall time / time_scale, except that a step lasts
        exactly its modelled length and an idle engine starts when woken, so the CPU overhead of the
        simulator (amplified by a small time_scale) does not show in modelled latencies.
        """
        now = time.monotonic() if wall is None else wall
        inflight = self._inflight
        if inflight is not None:
            start, wall_start, length = inflight
            return start + min((now - wall_start) * self._inv_scale, length)
        return self._m0 + (now - self._w0) * self._inv_scale

    async def run(self) -> None:
        clock = time.monotonic
        deadline = clock()
        chained = False  # the next step follows the previous one without an idle gap
        while True:
            step = None
            start = self._m0
            if not self.faults.paused and (self.waiting or self.running or self.link.active):
                now = clock()
                if not chained:
                    start += max(0.0, self._wake_wall - self._w0) * self._inv_scale
                step = self._schedule(start)
            if step is None:
                self._wake.clear()
                await self._idle(start)
                deadline = clock()
                chained = False
                continue
            faults = self.faults
            step_ms = self.time_model.step_ms(step.work) * faults.slowdown
            if faults.latency_spike_prob > 0 and self._rng.random() < faults.latency_spike_prob:
                step_ms += faults.latency_spike_ms
            length = step_ms / 1000.0
            start = step.start
            self._inflight = (start, now, length)
            deadline = max(deadline, now - _MAX_LAG_S) + length * self.config.time_scale
            await asyncio.sleep(max(0.0, deadline - clock()))
            self._inflight = None
            self._m0, self._w0 = start + length, clock()
            self._commit(step, start + length)
            chained = True

    async def _idle(self, now: float) -> None:
        """Wait for a wake-up, or (KV transfers in flight) until the next one lands or times out."""
        event = (
            None if self.faults.paused else self.link.next_event(now, stalled=self.faults.kv_transfer_stall)
        )
        if event is None:
            await self._wake.wait()
            return
        wall = self._w0 + (event - self._m0) * self.config.time_scale
        try:
            await asyncio.wait_for(self._wake.wait(), max(0.0, wall - time.monotonic()))
        except TimeoutError:
            self._wake_wall = wall  # the next step starts when the transfer landed, in model time

    def _land_transfers(self, now: float) -> None:
        """Transfers done by `now` join the running batch with one prompt token left to compute (as
        vLLM recomputes the last token for its logits); timed-out ones fail with a clear error."""
        done, failed = self.link.advance(now, stalled=self.faults.kv_transfer_stall)
        stats = self.stats
        for seq in done:
            stats.kv_transfers += 1
            seq.state = RUNNING
            seq.remote_prefill = False  # a later preemption recomputes locally
            seq.num_computed = seq.prompt_len - 1
            if self.config.enable_prefix_caching:
                self._store_full_blocks(seq)
            self.running.append(seq)
        for seq in failed:
            stats.kv_transfer_failures += 1
            seq.error = (
                f"KV transfer of {seq.prompt_len} prompt tokens did not complete within "
                f"{self.config.kv_transfer_timeout_s:g} s (remote prefill)."
            )
            self._release(seq)
            self._finish(seq, "abort", now, record=False)

    def _start_transfer(self, seq: Seq, now: float) -> bool:
        """A remote-prefill sequence takes blocks for its whole prompt and starts its KV transfer."""
        bs = self.config.block_size
        cache = self.cache
        hit = 0
        if self.config.enable_prefix_caching:
            hit = cache.match(seq.hashes, len(seq.hashes))
        need = -(-seq.prompt_len // bs) - hit
        hits = seq.hashes[:hit]
        if not cache.can_allocate(need, hits):
            return False
        cache.acquire(hits)
        cache.allocate(need)
        seq.held = [*hits, *([None] * need)]
        seq.num_stored = hit
        seq.state = TRANSFERRING
        start = max(now, seq.arrival)
        if seq.cached_tokens < 0:
            seq.cached_tokens = hit * bs
            seq.scheduled_at = start
            self.stats.queue_time.observe(start - seq.arrival)
        self.link.start(seq, seq.prompt_len, start)
        return True

    def _schedule(self, now: float) -> _Step | None:
        if self.link.active:
            self._land_transfers(now)
        config = self.config
        bs = config.block_size
        cache = self.cache
        running = self.running
        budget = config.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        prefill_tokens = decode_seqs = context_tokens = 0
        preempted = False

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(len(seq.tokens) - seq.num_computed, budget)
            need = -(-(seq.num_computed + n) // bs) - len(seq.held)
            while need > 0 and not cache.can_allocate(need):
                victim = running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.state != RUNNING:
                break
            if need > 0:
                cache.allocate(need)
                seq.held.extend([None] * need)
            scheduled.append((seq, n))
            budget -= n
            if n == 1 and seq.num_computed >= seq.prompt_len:
                decode_seqs += 1
                context_tokens += seq.num_computed
            else:
                prefill_tokens += n
            i += 1

        if not preempted:
            admitted_tokens, now = self._admit(now, budget, scheduled)
            prefill_tokens += admitted_tokens

        if not scheduled:
            return None
        lora_loads = 0
        if self._running_loras:
            lora_loads = self.slots.ensure(self._running_loras)
        if config.enable_lora:
            self.stats.record_lora(",".join(self._running_loras), ",".join(self._waiting_loras), time.time())
        return _Step(now, scheduled, StepWork(prefill_tokens, decode_seqs, context_tokens, lora_loads))

    def _admit(self, now: float, budget: int, scheduled: list[tuple[Seq, int]]) -> tuple[int, float]:
        """Admit waiting sequences FCFS; one whose adapter cannot get a slot is skipped, not blocking.

        Returns the prefill tokens admitted and the step's start, moved later if an admitted sequence
        arrived (in model time) after `now`: never before its arrival, so no modelled latency is negative.
        """
        start = now
        config = self.config
        bs = config.block_size
        cache = self.cache
        waiting = self.waiting
        running = self.running
        running_loras = self._running_loras
        skipped: list[Seq] = []
        prefill_tokens = 0
        while waiting and budget > 0 and len(running) < config.max_num_seqs:
            seq = waiting[0]
            if seq.remote_prefill:
                if not self._start_transfer(seq, now):
                    break
                waiting.popleft()
                if seq.adapter is not None:  # its adapter stays resident while the KV arrives
                    running_loras[seq.adapter.name] += 1
                    self._forget_waiting_lora(seq)
                continue
            adapter = seq.adapter
            if (
                adapter is not None
                and adapter.name not in running_loras
                and len(running_loras) >= config.max_loras
            ):
                skipped.append(waiting.popleft())
                continue
            hit = 0
            if config.enable_prefix_caching:
                # as vLLM: at least one token is computed, so a fully cached prompt recomputes its last block
                hit = cache.match(seq.hashes, min(len(seq.hashes), (len(seq.tokens) - 1) // bs))
            computed = hit * bs
            n = min(len(seq.tokens) - computed, budget)
            need = -(-(computed + n) // bs) - hit
            hits = seq.hashes[:hit]
            if not cache.can_allocate(need, hits):
                break
            waiting.popleft()
            cache.acquire(hits)
            cache.allocate(need)
            seq.held = [*hits, *([None] * need)]
            seq.num_computed = computed
            seq.num_stored = hit
            seq.state = RUNNING
            stats = self.stats
            stats.prefix_queries += len(seq.tokens)
            stats.prefix_hits += computed
            start = max(start, seq.arrival)
            if seq.cached_tokens < 0:
                seq.cached_tokens = computed
                seq.scheduled_at = max(now, seq.arrival)
                stats.queue_time.observe(seq.scheduled_at - seq.arrival)
            if adapter is not None:
                running_loras[adapter.name] += 1
                self._forget_waiting_lora(seq)
            running.append(seq)
            scheduled.append((seq, n))
            budget -= n
            prefill_tokens += n
        waiting.extendleft(reversed(skipped))
        return prefill_tokens, start

    def _preempt(self, seq: Seq) -> None:
        """vLLM's recompute preemption: free every block, requeue at the front, recompute later."""
        self.running.remove(seq)
        self.cache.release(seq.held)
        seq.held = []
        seq.num_computed = seq.num_stored = 0
        seq.state = WAITING
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1
        if seq.adapter is not None:
            self._forget_running_lora(seq)
            self._waiting_loras[seq.adapter.name] += 1

    def _commit(self, step: _Step, now: float) -> None:
        config = self.config
        bs = config.block_size
        stats = self.stats
        caching = config.enable_prefix_caching
        finished = False
        stats.steps += 1
        for seq, n in step.scheduled:
            if seq.state != RUNNING:  # aborted while the step ran
                continue
            seq.num_computed += n
            if caching:
                self._store_full_blocks(seq)
            if seq.num_computed < len(seq.tokens):
                continue  # prefill continues next step
            if seq.embedding:
                stats.prompt_tokens += seq.prompt_len
                seq.first_token_at = now
                stats.ttft.observe(now - seq.arrival)
                self._release(seq)
                self._finish(seq, "stop", now)
                finished = True
                continue
            word, eos = seq.sampler.next()
            seq.output.append(word)
            tokens = seq.tokens
            tokens.append(VOCAB_IDS[word])
            if len(tokens) % bs == 0:
                seq.last_digest = self.hasher.block(seq.last_digest, tokens[-bs:], seq.extra)
                seq.hashes.append(external_hash(seq.last_digest))
            stats.generation_tokens += 1
            if len(seq.output) == 1:
                stats.prompt_tokens += seq.prompt_len
                seq.first_token_at = now
                stats.ttft.observe(now - seq.arrival)
            else:
                stats.itl.observe(now - seq.last_token_at)
            seq.last_token_at = now
            if len(seq.output) >= seq.max_tokens or (eos and not seq.ignore_eos):
                self._release(seq)
                self._finish(seq, "length" if len(seq.output) >= seq.max_tokens else "stop", now)
                finished = True
            elif seq.stream:
                sink = seq.sink
                if sink is None or not sink(seq):
                    seq._notify()
        if finished:
            self.running = [s for s in self.running if s.state == RUNNING]
        self._flush_events()
        for listener in self.step_listeners:
            listener(self)

    def _store_full_blocks(self, seq: Seq) -> None:
        """Cache the blocks this step filled; emit one BlockStored per run of newly cached blocks."""
        full = min(seq.num_computed // self.config.block_size, len(seq.hashes))
        start = seq.num_stored
        if full <= start:
            return
        cache = self.cache
        run: list[int] = []
        run_start = start
        for index in range(start, full):
            h = seq.hashes[index]
            if cache.store(h):
                seq.held[index] = h
                if not run:
                    run_start = index
                run.append(h)
            elif run:
                self._stored_event(seq, run, run_start)
                run = []
        if run:
            self._stored_event(seq, run, run_start)
        seq.num_stored = full

    def _stored_event(self, seq: Seq, hashes: list[int], first: int) -> None:
        if not self.cache.record_events:
            return
        bs = self.config.block_size
        adapter = seq.adapter
        self.cache.stored_event(
            hashes,
            seq.hashes[first - 1] if first > 0 else None,
            seq.tokens[first * bs : (first + len(hashes)) * bs].tolist(),
            adapter.id if adapter is not None else None,
            adapter.name if adapter is not None else None,
            # vLLM publishes each block's extra hash keys (LoRA name, cache_salt on block 0)
            [seq.first_extra if i == 0 else seq.extra for i in range(first, first + len(hashes))],
        )

    def _release(self, seq: Seq) -> None:
        self.cache.release(seq.held)
        seq.held = []
        self._forget_running_lora(seq)

    def _finish(self, seq: Seq, reason: str, now: float, *, record: bool = True) -> None:
        seq.state = FINISHED
        seq.finish_reason = reason
        if record:
            stats = self.stats
            stats.success[reason] += 1
            stats.e2e.observe(now - seq.arrival)
        seq._notify()

    def _forget_running_lora(self, seq: Seq) -> None:
        if seq.adapter is not None:
            _decrement(self._running_loras, seq.adapter.name)

    def _forget_waiting_lora(self, seq: Seq) -> None:
        if seq.adapter is not None:
            _decrement(self._waiting_loras, seq.adapter.name)

    def _flush_events(self) -> None:
        if self.publisher is not None and self.cache.events:
            drop = self.faults.kv_events_drop > 0
            if drop:
                self.faults.kv_events_drop -= 1
            self.publisher.publish(self.cache.take_events(), drop=drop)

    # ---- inspection ---------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Queued requests, as vLLM counts them: those waiting for remote KV too."""
        return len(self.waiting) + len(self.link)

    @property
    def running_loras(self) -> tuple[str, ...]:
        return tuple(self._running_loras)

    @property
    def waiting_loras(self) -> tuple[str, ...]:
        return tuple(self._waiting_loras)

    def snapshot(self) -> dict[str, Any]:
        """Engine state for tests and the admin API."""
        cache = self.cache
        return {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "kv_cache_usage": cache.usage,
            "free_blocks": cache.free_blocks,
            "cached_blocks": cache.cached_blocks,
            "num_gpu_blocks": cache.num_blocks,
            "running_loras": list(self._running_loras),
            "waiting_loras": list(self._waiting_loras),
            "resident_loras": list(self.slots.resident),
            "steps": self.stats.steps,
            "kv_transfers_in_flight": len(self.link),
            "kv_transfers": self.stats.kv_transfers,
            "kv_transfer_failures": self.stats.kv_transfer_failures,
            "prefill_legs": self.stats.prefill_legs,
            "preemptions": self.stats.preemptions,
            "prefix_cache_queries": self.stats.prefix_queries,
            "prefix_cache_hits": self.stats.prefix_hits,
        }


def _decrement(counter: Counter[str], key: str) -> None:
    left = counter[key] - 1
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
