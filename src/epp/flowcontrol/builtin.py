"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.flowcontrol.detectors.concurrency import ConcurrencyDetector
from epp.flowcontrol.detectors.utilization import UtilizationDetector
from epp.flowcontrol.eviction.policies import PriorityThenTimeEvictionOrder, SheddableEvictionFilter
from epp.flowcontrol.fairness.global_strict import GlobalStrictFairnessPolicy
from epp.flowcontrol.fairness.program_aware import ProgramAwareFairness
from epp.flowcontrol.fairness.round_robin import RoundRobinFairnessPolicy
from epp.flowcontrol.ordering.edf import EdfOrderingPolicy
from epp.flowcontrol.ordering.fcfs import FcfsOrderingPolicy
from epp.flowcontrol.ordering.slo_deadline import SloDeadlineOrderingPolicy
from epp.flowcontrol.usage_limits.priority_holdback import PriorityHoldbackPolicy
from epp.flowcontrol.usage_limits.soft_reflective import SoftReflectiveCeilingPolicy
from epp.flowcontrol.usage_limits.static import StaticUsageLimitPolicy
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (
    UtilizationDetector,
    ConcurrencyDetector,
    GlobalStrictFairnessPolicy,
    RoundRobinFairnessPolicy,
    FcfsOrderingPolicy,
    EdfOrderingPolicy,
    SloDeadlineOrderingPolicy,
    StaticUsageLimitPolicy,
    SoftReflectiveCeilingPolicy,
    PriorityHoldbackPolicy,
    ProgramAwareFairness,
    SheddableEvictionFilter,
    PriorityThenTimeEvictionOrder,
)
