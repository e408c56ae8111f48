"""FlowControlAdmission: outcomes become GIE's errors; the controller runs inside the context manager."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epp.admission.api import AdmissionController
from epp.admission.flow_control import FlowControlAdmission, outcome_error
from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datalayer.api import EndpointMetadata
from epp.datastore.store import Datastore, PoolInfo
from epp.errors import EppError, Internal, ResourceExhausted, ServiceUnavailable
from epp.flowcontrol.api import Outcome
from epp.testing.flowcontrol import FakeDetector
from tests.flowcontrol.helpers import make_controller, req
from tests.scheduling.builders import endpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "examples" / "flow-control.yaml"


@pytest.mark.parametrize(
    ("outcome", "pool_empty", "cls", "status", "message"),
    [
        pytest.param(
            Outcome.REJECTED_CAPACITY,
            False,
            ResourceExhausted,
            429,
            "request rejected pre-queue: queue at capacity",
            id="capacity-429",
        ),
        pytest.param(
            Outcome.EVICTED_TTL,
            False,
            ResourceExhausted,
            429,
            "request timed out in queue: request evicted from queue: request TTL expired",
            id="ttl-with-endpoints-429",
        ),
        pytest.param(
            Outcome.EVICTED_TTL,
            True,
            ServiceUnavailable,
            503,
            "request timed out in queue: request evicted from queue: request TTL expired",
            id="ttl-empty-pool-503",
        ),
        pytest.param(
            Outcome.EVICTED_CONTEXT_CANCELLED,
            False,
            ServiceUnavailable,
            503,
            "client disconnected: request evicted from queue: request context cancelled: context canceled",
            id="cancelled-503",
        ),
        pytest.param(
            Outcome.REJECTED_OTHER,
            False,
            Internal,
            500,
            "internal flow control error: request rejected pre-queue: flow controller is not running",
            id="rejected-other-500",
        ),
        pytest.param(
            Outcome.EVICTED_OTHER,
            False,
            Internal,
            500,
            "internal flow control error: request evicted from queue: flow controller is not running",
            id="evicted-other-500",
        ),
        pytest.param(
            Outcome.NOT_YET_FINALIZED,
            False,
            Internal,
            500,
            "unhandled flow control outcome: request rejected by flow control",
            id="unfinalized-500",
        ),
    ],
)
def test_outcome_errors(
    outcome: Outcome, pool_empty: bool, cls: type[EppError], status: int, message: str
) -> None:
    """Each non-dispatch outcome maps to its status code and GIE's message text."""
    err = outcome_error(outcome, pool_empty=pool_empty)
    assert type(err) is cls
    assert (err.http_status, err.msg) == (status, message)


def test_dispatched_is_no_error() -> None:
    """Dispatched admits the request."""
    assert outcome_error(Outcome.DISPATCHED, pool_empty=True) is None


async def test_admit_passes_when_pool_has_room() -> None:
    """An admitted request returns from admit(); the adapter is an AdmissionController (for mypy)."""
    controller, detector = make_controller()
    async with FlowControlAdmission(controller) as admission:
        checked: AdmissionController = admission
        await checked.admit(req(), [endpoint(0)])
    assert (controller.queued, detector.calls) == (0, 1)


@pytest.mark.parametrize(
    ("endpoints", "cls"),
    [
        pytest.param([endpoint(0)], ResourceExhausted, id="endpoints-present-429"),
        pytest.param([], ServiceUnavailable, id="scale-from-zero-503"),
    ],
)
async def test_ttl_eviction_status_depends_on_pool(endpoints: list[object], cls: type[EppError]) -> None:
    """A request that waits out its TTL is refused: 429 while the pool has endpoints, 503 when empty."""
    controller, _ = make_controller(
        {"defaultRequestTTL": "10ms"},
        detector=FakeDetector(1.0),
        endpoints=endpoints,  # type: ignore[arg-type]
    )
    async with FlowControlAdmission(controller) as admission:
        with pytest.raises(cls, match="request timed out in queue"):
            await asyncio.wait_for(admission.admit(req(), []), 5)


async def test_capacity_rejection_is_429() -> None:
    """A request that does not fit the queue is a 429 with GIE's text."""
    controller, detector = make_controller({"maxRequests": 1}, detector=FakeDetector(1.0))
    async with FlowControlAdmission(controller) as admission:
        first = asyncio.create_task(admission.admit(req("a"), []))
        await asyncio.sleep(0)  # one loop turn: the first request parks in its queue
        assert controller.queued == 1
        with pytest.raises(ResourceExhausted) as err:
            await admission.admit(req("b"), [])
        assert err.value.msg == "request rejected pre-queue: queue at capacity"
        detector.value = 0.0
        admission.notify()
        await asyncio.wait_for(first, 5)


async def test_outside_context_manager_requests_are_refused() -> None:
    """Without a running controller, admission refuses with a 500 instead of hanging."""
    controller, _ = make_controller()
    with pytest.raises(Internal, match="flow controller is not running"):
        await FlowControlAdmission(controller).admit(req(), [])


async def test_from_plan_with_datastore() -> None:
    """Built from the shipped example and a datastore: the datastore's endpoints are the pool."""
    plan = build(load_config_file(EXAMPLE), default_registry(entry_points=False)).admission.flow_control
    assert plan is not None
    ds = Datastore()
    ds.pool = PoolInfo(name="my-pool")
    ds.upsert(EndpointMetadata(name="default/pod-0-rank-0", address="10.0.0.1", port=8000))
    admission = FlowControlAdmission.from_plan(plan, ds)
    assert not admission.controller.pool_is_empty()
    ds.clear()
    assert admission.controller.pool_is_empty()
    assert admission.controller._pool == "my-pool"
