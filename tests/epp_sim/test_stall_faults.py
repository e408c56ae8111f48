"""The stall faults: one HTTP path hangs (accepted, never answered) while the other answers, set
at start (an override) or live (POST /sim/faults), and a stalled request resumes when cleared."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from epp_sim.config import FleetConfig, parse_override
from epp_sim.fleet import Fleet
from tests.epp_sim.helpers import engine_config

COMPLETION = {"model": "mock-model", "prompt": "x", "max_tokens": 2}


async def _pending(coro: asyncio.Task[int], seconds: float = 0.3) -> bool:
    """Whether ``coro`` is still unanswered after ``seconds`` (a hang is the absence of an answer)."""
    done, _ = await asyncio.wait({coro}, timeout=seconds)
    return not done


async def _status(http: aiohttp.ClientSession, method: str, url: str, **kw: object) -> int:
    async with http.request(method, url, **kw) as response:  # type: ignore[arg-type]
        await response.read()
        return response.status


@pytest.mark.parametrize(
    ("fault", "stalls", "answers"),
    [
        pytest.param("inference_stall", ("POST", "/v1/completions"), ("GET", "/metrics"), id="inference"),
        pytest.param("metrics_stall", ("GET", "/metrics"), ("POST", "/v1/completions"), id="metrics"),
    ],
)
async def test_a_stall_holds_one_path_and_resumes_when_cleared(
    http: aiohttp.ClientSession, fault: str, stalls: tuple[str, str], answers: tuple[str, str]
) -> None:
    async with Fleet(FleetConfig(replicas=1, engine=engine_config())) as fleet:
        url = fleet.replicas[0].url
        await fleet.set_faults(replica=0, **{fault: True})
        held = asyncio.create_task(_status(http, stalls[0], url + stalls[1], json=COMPLETION))
        assert await _pending(held)
        assert await _status(http, answers[0], url + answers[1], json=COMPLETION) == 200
        async with http.post(url + "/sim/faults", json={fault: False}) as response:
            assert (await response.json())[fault] is False
        assert await asyncio.wait_for(held, 5.0) == 200  # it resumes, as after SIGCONT


async def test_a_stall_can_be_set_at_start() -> None:
    override = parse_override("replica=0,inference-stall=true")
    config = FleetConfig(replicas=1, engine=engine_config(), overrides=(override,))
    assert config.replica_configs()[0].faults.inference_stall is True
