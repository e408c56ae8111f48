"""Contracts of flow-control plugins; saturation detectors also serve legacy admission."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.plugin.base import Plugin


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    """How full the pool is: 0 idle, >= 1.0 saturated.  No endpoints means saturated (1.0).

    Detectors in GIE are also scheduling filters; those that are implement
    ``epp.scheduling.api.Filter`` as well.
    """

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class UsageLimitPolicy(Plugin, Protocol):
    """Per-priority saturation ceilings: a band dispatches only while saturation < its ceiling."""

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]: ...
