"""The KV-transfer link of a decode rank: remote prefills land here before the engine decodes them.

P/D disaggregation replaces a decode pod's prefill compute by a transfer of the prompt's KV cache
from the prefill pod (vLLM's NixlConnector pulls it over RDMA). The link is processor sharing, as
inference-sim's P/D model: every transfer in flight gets an equal share of the bandwidth, so
concurrent transfers slow each other down. A transfer costs ``base_ms`` (handshake, notification)
plus ``ms_per_token`` per prompt token at full bandwidth; it always moves the whole prompt (as
llm-d-inference-sim: a local prefix-cache hit does not shorten it). All times are modelled
milliseconds/seconds; the engine drives the link with its model clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from epp_sim.sequence import Seq

_EPS: Final = 1e-6  # ms of work or s of clock: float noise, far below any modelled cost


@dataclass(slots=True)
class Transfer:
    seq: Seq
    started: float  # model seconds
    not_before: float  # the fixed latency: no transfer completes earlier
    remaining_ms: float  # work left at full bandwidth


class TransferLink:
    """Transfers in flight on one rank; ``advance(now)`` returns those done and those timed out."""

    def __init__(self, ms_per_token: float, base_ms: float, timeout_s: float) -> None:
        self.ms_per_token = ms_per_token
        self.base_ms = base_ms
        self.timeout_s = timeout_s
        self.active: list[Transfer] = []
        self._last = 0.0

    def __len__(self) -> int:
        return len(self.active)

    def start(self, seq: Seq, tokens: int, now: float) -> None:
        self.advance(now, stalled=False)
        self.active.append(Transfer(seq, now, now + self.base_ms / 1000.0, tokens * self.ms_per_token))

    def remove(self, seq: Seq) -> bool:
        for i, t in enumerate(self.active):
            if t.seq is seq:
                del self.active[i]
                return True
        return False

    def advance(self, now: float, *, stalled: bool) -> tuple[list[Seq], list[Seq]]:
        """Move the clock to ``now`` (model s): (completed, timed out). A stalled link moves no bytes."""
        dt_ms = (now - self._last) * 1000.0
        if dt_ms > 0:
            self._last = now
            if not stalled:
                self._share(dt_ms)
        done: list[Seq] = []
        failed: list[Seq] = []
        keep: list[Transfer] = []
        for t in self.active:
            if t.remaining_ms <= _EPS and t.not_before <= now + _EPS:
                done.append(t.seq)
            elif now - t.started >= self.timeout_s - _EPS:
                failed.append(t.seq)
            else:
                keep.append(t)
        self.active = keep
        return done, failed

    def _share(self, dt_ms: float) -> None:
        """Processor sharing: the busy transfers split the bandwidth equally until dt runs out."""
        while dt_ms > _EPS:
            busy = [t for t in self.active if t.remaining_ms > _EPS]
            if not busy:
                return
            step = min(t.remaining_ms for t in busy)
            if step * len(busy) <= dt_ms:
                dt_ms -= step * len(busy)
            else:
                step = dt_ms / len(busy)
                dt_ms = 0.0
            for t in busy:
                t.remaining_ms -= step

    def next_event(self, now: float, *, stalled: bool) -> float | None:
        """Model time of the next completion or timeout if nothing new arrives; None when idle."""
        if not self.active:
            return None
        events = [t.started + self.timeout_s for t in self.active]
        busy = [t for t in self.active if t.remaining_ms > _EPS]
        events.extend(max(t.not_before, now) for t in self.active if t.remaining_ms <= _EPS)
        if busy and not stalled:
            first = min(busy, key=lambda t: t.remaining_ms)
            events.append(max(first.not_before, now + first.remaining_ms * len(busy) / 1000.0))
        return min(events)
