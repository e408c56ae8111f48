"""Ordering policies' keys: FCFS by enqueue time, EDF by enqueue+TTL, SLO by receive+x-slo-ttft-ms."""

from __future__ import annotations

import math
from typing import Any

import pytest

from epp.flowcontrol.api import OrderingPolicy, QueueCapability
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.ordering.slo_deadline import SloDeadlineOrderingPolicy, slo_deadline
from epp.plugin.base import NoParams
from epp.testing.flowcontrol import FakeItem
from epp.testing.plugins import FakeHandle
from tests.flowcontrol.helpers import req


def _key(cls: Any, **item: Any) -> tuple[float, float]:
    policy = cls(cls.TYPE, NoParams(), FakeHandle())
    assert isinstance(policy, OrderingPolicy)
    key: tuple[float, float] = policy.order_key(FakeItem((0.0, 0.0, 0), **item))
    return key


@pytest.mark.parametrize(
    ("cls", "item", "expected"),
    [
        pytest.param(
            FcfsOrderingPolicy, {"enqueued_at": 3.0, "ttl": 1.0}, (3.0, 0.0), id="fcfs-enqueue-time"
        ),
        pytest.param(
            EdfOrderingPolicy, {"enqueued_at": 3.0, "ttl": 2.0}, (5.0, 3.0), id="edf-enqueue-plus-ttl"
        ),
        pytest.param(
            EdfOrderingPolicy, {"enqueued_at": 3.0, "ttl": 0.0}, (math.inf, 3.0), id="edf-no-ttl-last"
        ),
        pytest.param(
            SloDeadlineOrderingPolicy,
            {"request": req(headers={"x-slo-ttft-ms": "250"}, received_at=10.0)},
            (10.25, 10.0),
            id="slo-receive-plus-header",
        ),
        pytest.param(
            SloDeadlineOrderingPolicy,
            {"request": req(received_at=10.0)},
            (math.inf, 10.0),
            id="slo-no-header-last-by-receive-time",
        ),
        pytest.param(
            SloDeadlineOrderingPolicy,
            {
                "request": req(
                    headers={"x-llm-d-slo-ttft-ms": "100", "x-slo-ttft-ms": "250"}, received_at=10.0
                )
            },
            (10.1, 10.0),
            id="slo-llm-d-header-name-wins-over-the-old-one",
        ),
    ],
)
def test_order_key(cls: Any, item: dict[str, Any], expected: tuple[float, float]) -> None:
    """Smaller keys dispatch first; the second element breaks deadline ties by arrival."""
    assert _key(cls, **item) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("100", 1.1, id="integer-ms"),
        pytest.param(" 100 ", 1.1, id="spaces-trimmed"),
        pytest.param("+100", 1.1, id="explicit-plus"),
        pytest.param("0", 1.0, id="zero"),
        pytest.param("-1", math.inf, id="negative"),
        pytest.param("1.5", math.inf, id="not-an-integer"),
        pytest.param("1_000", math.inf, id="python-underscores-rejected"),
        pytest.param("", math.inf, id="empty"),
        pytest.param(None, math.inf, id="absent"),
        pytest.param(str(1 << 63), math.inf, id="int64-overflow"),
    ],
)
def test_slo_header_parsing(value: str | None, expected: float) -> None:
    """x-slo-ttft-ms is parsed like Go's ParseInt: integers >= 0 only, anything else is no deadline."""
    assert slo_deadline(1.0, value) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cls", "required"),
    [
        pytest.param(FcfsOrderingPolicy, frozenset(), id="fcfs"),
        pytest.param(EdfOrderingPolicy, {QueueCapability.PRIORITY_CONFIGURABLE}, id="edf"),
        pytest.param(SloDeadlineOrderingPolicy, {QueueCapability.PRIORITY_CONFIGURABLE}, id="slo"),
    ],
)
def test_required_capabilities(cls: Any, required: frozenset[QueueCapability]) -> None:
    """Deadline orderings need a priority-configurable queue; FCFS needs nothing."""
    assert required == cls.REQUIRED_CAPABILITIES
