"""Shared builders for the simulator tests: engines, sequences, SSE reading, metric parsing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from epp_sim.config import EngineConfig
from epp_sim.engine import Engine
from epp_sim.lora import Adapter
from epp_sim.sequence import Seq
from epp_sim.tokens import OutputStream, token_ids

FAST = EngineConfig(time_scale=0.01)


def engine_config(**changes: Any) -> EngineConfig:
    """A fast engine (time_scale 0.01) with `changes` applied."""
    return dataclasses.replace(FAST, **changes)


def make_seq(
    text: str,
    *,
    max_tokens: int = 4,
    ignore_eos: bool = True,
    adapter: Adapter | None = None,
    stream: bool = False,
    eos_probability: float = 0.0,
) -> Seq:
    return Seq(
        "req",
        token_ids(text),
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        adapter=adapter,
        stream=stream,
        sampler=OutputStream(text.encode(), 0, eos_probability),
    )


@contextlib.asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[Engine]:
    """Run the engine's scheduler loop for the duration of the block."""
    task = asyncio.create_task(engine.run())
    try:
        yield engine
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def finished(*seqs: Seq) -> None:
    for seq in seqs:
        while not seq.finished:
            await seq.wait()


def pause_when(engine: Engine, condition: Callable[[Engine], bool]) -> asyncio.Event:
    """Pause the engine after the first step where `condition` holds; the event fires then."""
    reached = asyncio.Event()

    def listener(e: Engine) -> None:
        if not reached.is_set() and condition(e):
            e.faults.paused = True
            reached.set()

    engine.step_listeners.append(listener)
    return reached


async def read_sse(response: aiohttp.ClientResponse) -> list[Any]:
    """Every `data:` payload of an SSE body, JSON-decoded except the final `[DONE]`."""
    events: list[Any] = []
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        payload = line.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse Prometheus text: sample name → [(labels, value)]; fails on malformed exposition."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` whose labels include `labels`."""
    matches = [v for lbls, v in metric_samples(text).get(name, []) if labels.items() <= lbls.items()]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples"
    return matches[0]
