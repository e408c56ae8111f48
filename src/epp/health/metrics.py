"""Metrics of endpoint health (docs/health.md).  Not GIE's: ``epp_``-prefixed, in the one registry."""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Gauge
from epp.metrics.series import REGISTRY

HEALTH_TRANSITIONS: Final = Counter(
    "epp_endpoint_health_transitions_total",
    "Endpoint health transitions, by the state entered and the reason.",
    ("endpoint", "state", "reason"),
    registry=REGISTRY,
)
HEALTH_STATE: Final = Gauge(
    "epp_endpoint_health_state",
    "Each endpoint's health: 0 healthy, 1 degraded (penalised), 2 probing, 3 ejected, 4 unreachable.",
    ("endpoint",),
    registry=REGISTRY,
)
