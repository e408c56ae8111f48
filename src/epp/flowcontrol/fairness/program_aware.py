"""``program-aware-fairness`` (llm-d-router): fairness between programs (workflows, tenants) by tokens served.

Round-robin is fair per request; an agentic workflow that sends a few huge requests and one that
sends many small ones are not served alike.  This policy (strategy ``las``, Least Attained
Service) dispatches from the program that has consumed the fewest weighted tokens lately, the
head-of-queue wait breaking near-ties, and lets an idle program's service decay so it returns on
near-equal footing.  A program is a fairness id (``x-llm-d-inference-fairness-id`` /
``x-gateway-inference-fairness-id``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.flowcontrol.api import FairnessState, FlowQueueView
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo

WEIGHT_INPUT_TOKEN: Final = 1
WEIGHT_OUTPUT_TOKEN: Final = 2  # output tokens cost about twice as much compute


class ProgramAwareParams(PluginParams):
    strategy: Literal["las"] = "las"
    las_weight_service: float = Field(default=0.8, ge=0.0)
    las_weight_head_wait: float = Field(default=0.2, ge=0.0)
    las_decay_factor: float = Field(default=0.99997, gt=0.0, le=1.0)
    las_half_life_seconds: float = Field(default=0.0, ge=0.0)
    eviction_ttl_seconds: float = Field(default=3600.0, ge=0.0)
    eviction_sweep_seconds: float = Field(default=300.0, gt=0.0)


class _Program:
    __slots__ = ("anchor", "in_flight", "last_completion", "service")

    def __init__(self, now: float) -> None:
        self.service = 0.0
        self.anchor = 0.0  # when the service last changed or decayed (0: never)
        self.in_flight = 0
        self.last_completion = now


def _norm(v: float, lo: float, hi: float) -> float:
    return 0.5 if hi == lo else (v - lo) / (hi - lo)


class _Band:
    """One band's non-empty flows; the service table is the policy's, shared by its bands."""

    __slots__ = ("_policy", "_queues")

    def __init__(self, policy: ProgramAwareFairness) -> None:
        self._policy = policy
        self._queues: dict[str, FlowQueueView] = {}

    def head_changed(self, queue: FlowQueueView) -> None:
        if len(queue):
            self._queues[queue.flow.id] = queue
        else:
            self._queues.pop(queue.flow.id, None)

    def pick(self) -> FlowQueueView | None:
        return self._policy.choose(self._queues)


class ProgramAwareFairness(PluginBase):
    """Type ``program-aware-fairness`` (a fairness policy, and PreRequest / ResponseComplete hooks).

    Per pick over the band's non-empty flows: ``score = wS * (1 - norm(service)) + wW * norm(headWait)``
    with ``norm`` min-max over those flows (0.5 when all equal); the highest score dispatches (ties:
    the flow queued first; upstream's map order is random).  Programs with nothing queued and
    nothing in flight decay on each pick: ``service *= 0.5 ** (elapsed / lasHalfLifeSeconds)`` when
    that is > 0, else ``service *= lasDecayFactor``.  A finished request adds ``prompt + 2 *
    completion`` tokens (its reported usage) to its program.  Programs idle (no completion, nothing
    in flight) for ``evictionTtlSeconds`` are forgotten, checked every ``evictionSweepSeconds``.
    Parameters and defaults are upstream's (``strategy`` must be ``las``).
    """

    TYPE: ClassVar[str] = "program-aware-fairness"
    PARAMS: ClassVar[type[PluginParams]] = ProgramAwareParams

    def __init__(self, name: str, params: ProgramAwareParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.w_service = params.las_weight_service
        self.w_wait = params.las_weight_head_wait
        self.decay_factor = params.las_decay_factor
        self.half_life = params.las_half_life_seconds
        self.ttl = params.eviction_ttl_seconds
        self.sweep_every = params.eviction_sweep_seconds
        self.clock: Callable[[], float] = time.monotonic
        self.programs: dict[str, _Program] = {}
        self._next_sweep = 0.0

    def new_state(self) -> FairnessState:
        return _Band(self)

    def _program(self, program_id: str) -> _Program:
        p = self.programs.get(program_id)
        if p is None:
            p = self.programs[program_id] = _Program(self.clock())
        return p

    def _decay(self, p: _Program, now: float) -> None:
        if self.half_life > 0:
            if p.anchor == 0.0:
                p.anchor = now
                return
            elapsed = now - p.anchor
            if elapsed > 0:
                p.service *= 0.5 ** (elapsed / self.half_life)
                p.anchor = now
            return
        p.service *= self.decay_factor

    def choose(self, queues: dict[str, FlowQueueView]) -> FlowQueueView | None:
        # Not named ``pick``: a plugin with a ``pick`` method passes for a scheduling Picker
        # (a runtime-checkable protocol checks names only) and became the profiles' picker.
        now = self.clock()
        self._sweep(now)
        for program_id, p in self.programs.items():
            if program_id not in queues and p.in_flight == 0:
                self._decay(p, now)
        if not queues:
            return None
        rows: list[tuple[FlowQueueView, float, float]] = []
        for program_id, queue in queues.items():
            head = queue.head()
            wait = (now - head.enqueued_at) * 1000.0 if head is not None else 0.0
            rows.append((queue, self._program(program_id).service, wait))
        s_lo = min(r[1] for r in rows)
        s_hi = max(r[1] for r in rows)
        w_lo = min(r[2] for r in rows)
        w_hi = max(r[2] for r in rows)
        best: FlowQueueView | None = None
        best_score = float("-inf")
        for queue, service, wait in rows:
            score = self.w_service * (1.0 - _norm(service, s_lo, s_hi)) + self.w_wait * _norm(
                wait, w_lo, w_hi
            )
            if score > best_score:
                best, best_score = queue, score
        return best

    def _sweep(self, now: float) -> None:
        if self.ttl <= 0 or now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_every
        idle = [
            k for k, p in self.programs.items() if p.in_flight == 0 and now - p.last_completion > self.ttl
        ]
        for k in idle:
            del self.programs[k]

    # request lifecycle --------------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: Any) -> None:
        """``result`` is the SchedulingResult (untyped: flow control sits below scheduling)."""
        self._program(request.fairness_id).in_flight += 1

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        p = self._program(request.fairness_id)
        p.in_flight = max(0, p.in_flight - 1)
        now = self.clock()
        p.last_completion = now
        usage = response.usage
        if usage is not None:
            p.service += (
                WEIGHT_INPUT_TOKEN * usage.prompt_tokens + WEIGHT_OUTPUT_TOKEN * usage.completion_tokens
            )
            p.anchor = now

    def debug_state(self) -> dict[str, Any]:
        top = sorted(self.programs.items(), key=lambda kv: -kv[1].service)[:100]
        return {
            "programs": len(self.programs),
            "attainedService": {k: round(p.service, 3) for k, p in top},
        }
