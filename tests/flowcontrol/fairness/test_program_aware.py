"""program-aware-fairness: least attained service (llm-d-router's LAS strategy) over fairness ids."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from epp.flowcontrol.api import FairnessPolicy
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.fairness.program_aware import ProgramAwareFairness
from epp.flowcontrol.usage_limits.static import StaticUsageLimitParams, StaticUsageLimitPolicy
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, Usage
from epp.testing.builders import make_endpoint
from epp.testing.clock import ManualClock
from epp.testing.flowcontrol import FakeDetector, FakeItem, FakeQueue
from epp.testing.plugins import FakeHandle, build
from tests.flowcontrol.helpers import policy_plugins, queue_up, req, settings


def _policy(**params: Any) -> tuple[ProgramAwareFairness, ManualClock]:
    policy: ProgramAwareFairness = build(ProgramAwareFairness, **params)
    assert isinstance(policy, FairnessPolicy)
    clock = ManualClock()
    policy.clock = clock
    return policy, clock


def _queue(program: str, enqueued_at: float) -> FakeQueue:
    q = FakeQueue(program)
    q.push(FakeItem((0.0, 0.0, 0), enqueued_at=enqueued_at))
    return q


def _serve(policy: ProgramAwareFairness, program: str, prompt: int, completion: int) -> None:
    req = InferenceRequest(request_id="r", headers={}, fairness_id=program)
    policy.pre_request(CycleState(), req, None)
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    policy.response_complete(CycleState(), req, ResponseInfo(request_id="r", usage=usage), None)


def test_least_served_program_goes_first() -> None:
    policy, clock = _policy()
    _serve(policy, "heavy", 1000, 500)  # 1000 + 2 * 500 = 2000 weighted tokens
    _serve(policy, "light", 10, 5)
    assert policy.programs["heavy"].service == 2000
    band = policy.new_state()
    heavy, light = _queue("heavy", clock.now - 5), _queue("light", clock.now - 1)
    band.head_changed(heavy)
    band.head_changed(light)
    # light: 0.8 * (1 - 0) + 0.2 * 0 = 0.8; heavy: 0.8 * 0 + 0.2 * 1 = 0.2
    assert band.pick() is light


def test_head_wait_breaks_a_service_tie() -> None:
    policy, clock = _policy()
    band = policy.new_state()
    newer, older = _queue("a", clock.now - 1), _queue("b", clock.now - 9)
    band.head_changed(newer)
    band.head_changed(older)
    assert band.pick() is older  # equal service: 0.8 * 0.5 each; the older head adds 0.2


def test_idle_programs_decay_and_are_evicted() -> None:
    policy, clock = _policy(lasHalfLifeSeconds=10, evictionTtlSeconds=60, evictionSweepSeconds=1)
    _serve(policy, "a", 100, 0)
    band = policy.new_state()
    band.pick()  # anchors the decay clock of idle "a"
    clock.now += 10
    band.pick()
    assert policy.programs["a"].service == pytest.approx(50.0)
    clock.now += 61
    assert band.pick() is None
    assert "a" not in policy.programs


def test_per_pick_decay_factor_and_in_flight_programs_keep_their_service() -> None:
    policy, _ = _policy(lasDecayFactor=0.5)
    _serve(policy, "idle", 100, 0)
    busy = InferenceRequest(request_id="b", headers={}, fairness_id="busy")
    _serve(policy, "busy", 100, 0)
    policy.pre_request(CycleState(), busy, None)  # still in flight
    policy.new_state().pick()
    assert policy.programs["idle"].service == 50.0
    assert policy.programs["busy"].service == 100.0


@pytest.mark.parametrize(
    "params",
    [{"strategy": "wfq"}, {"lasDecayFactor": 0.0}, {"lasDecayFactor": 1.5}, {"evictionSweepSeconds": 0}],
)
def test_invalid_parameters_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case fails on its own field
        build(ProgramAwareFairness, **params)


async def test_flow_controller_dispatches_the_least_served_program_first() -> None:
    """Through the real controller: a program that consumed many tokens waits behind a fresh one."""
    policy, _ = _policy()
    policy.clock = time.monotonic
    _serve(policy, "heavy", 1000, 500)
    plugins = policy_plugins()
    plugins[policy.TYPE] = policy
    detector = FakeDetector(1.0)
    controller = FlowController(
        settings(
            defaultPriorityBand={
                "orderingPolicyRef": "fcfs-ordering-policy",
                "fairnessPolicyRef": policy.TYPE,
            }
        ),
        detector=detector,
        usage_limit=StaticUsageLimitPolicy("limits", StaticUsageLimitParams(), FakeHandle()),
        plugins=plugins,
        endpoints=lambda: (make_endpoint(0),),
        pool_name="pool-program-aware",
    )
    done: list[str] = []
    async with controller:
        tasks = await queue_up(
            controller, [req("h1", flow="heavy"), req("h2", flow="heavy"), req("l1", flow="light")], done
        )
        detector.value = 0.0
        controller.notify()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert done == ["l1", "h1", "h2"]
