"""Fakes and builders for flow-control tests: a detector whose saturation the test sets, real policies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from epp.config.schema import FlowControlConfig
from epp.datalayer.api import Endpoint
from epp.flowcontrol.api import Outcome
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.fairness.global_strict import GlobalStrictFairnessPolicy
from epp.flowcontrol.fairness.round_robin import RoundRobinFairnessPolicy
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.ordering.slo_deadline import SloDeadlineOrderingPolicy
from epp.flowcontrol.usage_limits.static import StaticUsageLimitParams, StaticUsageLimitPolicy
from epp.metrics.series import REGISTRY
from epp.plugin.base import NoParams, Plugin
from epp.request import InferenceRequest
from epp.testing.flowcontrol import FakeDetector
from epp.testing.plugins import FakeHandle
from tests.scheduling.builders import endpoint

_POOLS = itertools.count()


def policy_plugins() -> dict[str, Plugin]:
    """Every built-in policy, named by its type as the config builder names defaults."""
    handle = FakeHandle()
    plugins: list[Plugin] = [
        cls(cls.TYPE, NoParams(), handle)
        for cls in (
            FcfsOrderingPolicy,
            EdfOrderingPolicy,
            SloDeadlineOrderingPolicy,
            GlobalStrictFairnessPolicy,
            RoundRobinFairnessPolicy,
        )
    ]
    plugins.append(StaticUsageLimitPolicy(StaticUsageLimitPolicy.TYPE, StaticUsageLimitParams(), handle))
    return {p.typed_name.name: p for p in plugins}


def settings(**doc: Any) -> FlowControlConfig:
    """A ``flowControl`` section as the config builder hands it over (defaults resolved)."""
    return FlowControlConfig.model_validate(doc).resolved()


def make_controller(
    doc: Mapping[str, Any] | None = None,
    *,
    detector: FakeDetector | None = None,
    usage: Any = None,
    endpoints: Sequence[Endpoint] | None = None,
    **kwargs: Any,
) -> tuple[FlowController, FakeDetector]:
    """A controller over one endpoint, with a fresh pool label so metric samples are the test's own."""
    detector = detector or FakeDetector()
    plugins = policy_plugins()
    pool = tuple(endpoints) if endpoints is not None else (endpoint(0),)
    controller = FlowController(
        settings(**(doc or {})),
        detector=detector,
        usage_limit=usage or StaticUsageLimitPolicy("limits", StaticUsageLimitParams(), FakeHandle()),
        plugins=plugins,
        endpoints=lambda: pool,
        pool_name=f"pool-{next(_POOLS)}",
        **kwargs,
    )
    return controller, detector


def req(
    request_id: str = "r",
    *,
    flow: str = "default-flow",
    priority: int = 0,
    headers: dict[str, str] | None = None,
    received_at: float = 0.0,
) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        headers=headers or {},
        fairness_id=flow,
        priority=priority,
        incoming_model="m",
        target_model="m",
        received_at=received_at,
    )


async def record(
    controller: FlowController,
    request: InferenceRequest,
    done: list[str],
    size: int = 1,
    ttl: float | None = None,
) -> Outcome:
    """Wait in flow control, then note the request id: ``done`` lists dispatches in order."""
    outcome = await controller.enqueue_and_wait(request, size, ttl=ttl)
    done.append(request.request_id)
    return outcome


async def queue_up(
    controller: FlowController,
    requests: Sequence[InferenceRequest],
    done: list[str],
    size: int = 1,
    ttl: float | None = None,
) -> list[asyncio.Task[Outcome]]:
    """Start one waiter per request, in order, each parked in its queue before the next starts."""
    tasks = []
    for request in requests:
        before = controller.queued
        tasks.append(asyncio.create_task(record(controller, request, done, size, ttl)))
        await asyncio.sleep(0)  # one loop turn: the new task runs up to its wait
        assert controller.queued == before + 1, f"{request.request_id} was not queued"
    return tasks


def sample(name: str, **labels: str) -> float:
    """A sample's value from the EPP registry, 0.0 when absent."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
