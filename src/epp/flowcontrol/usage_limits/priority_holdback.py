"""``priority-holdback-policy`` (llm-d-router): fixed, stepped ceilings that hold lower priorities back first.

Unlike the soft reflective policy the ceilings do not move with saturation: the top band may
dispatch until ``maxCeiling``, the lowest until ``minCeiling``, the bands between evenly spaced
by rank (``domain: rank``) or by priority value (``domain: value``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import model_validator

from epp.plugin.base import Handle, PluginBase, PluginParams


class PriorityHoldbackParams(PluginParams):
    min_ceiling: float  # required, as upstream
    max_ceiling: float = 1.0
    shape: Literal["linear"] = "linear"
    domain: Literal["rank", "value"] = "rank"

    @model_validator(mode="after")
    def _bounds(self) -> PriorityHoldbackParams:
        if not 0.0 <= self.min_ceiling < 1.0:
            raise ValueError(f"minCeiling must be in [0.0, 1.0), got {self.min_ceiling}")
        if not 0.0 < self.max_ceiling <= 1.0:
            raise ValueError(f"maxCeiling must be in (0.0, 1.0], got {self.max_ceiling}")
        if self.min_ceiling >= self.max_ceiling:
            raise ValueError(
                f"minCeiling ({self.min_ceiling}) must be strictly less than maxCeiling ({self.max_ceiling})"
            )
        return self


class PriorityHoldbackPolicy(PluginBase):
    """Type ``priority-holdback-policy``.  Priorities come highest first; one band gets ``maxCeiling``.

    ``rank``: band ``i`` of ``N`` gets ``max - i * (max - min) / (N - 1)``.  ``value``: band with
    priority ``p`` gets ``min + (p - p_low) / (p_high - p_low) * (max - min)`` (all ``max`` when
    every priority is equal).  Parameters: ``minCeiling`` (required, [0, 1)), ``maxCeiling``
    (1.0, (0, 1], > min), ``shape`` (``linear``), ``domain`` (``rank``).  llm-d-router's formulas.
    """

    TYPE: ClassVar[str] = "priority-holdback-policy"
    PARAMS: ClassVar[type[PluginParams]] = PriorityHoldbackParams

    def __init__(self, name: str, params: PriorityHoldbackParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.min_ceiling = params.min_ceiling
        self.max_ceiling = params.max_ceiling
        self.by_value = params.domain == "value"
        self._cache: tuple[tuple[int, ...], list[float]] = ((), [])

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        key = tuple(priorities)
        if key == self._cache[0]:
            return self._cache[1]  # ceilings depend on the bands only, not on saturation
        lo, hi, n = self.min_ceiling, self.max_ceiling, len(priorities)
        if n == 1:
            limits = [hi]
        elif self.by_value:
            p_low, p_high = priorities[-1], priorities[0]
            span = p_high - p_low
            limits = [hi] * n if span == 0 else [lo + (p - p_low) / span * (hi - lo) for p in priorities]
        else:
            limits = [hi - i * (hi - lo) / (n - 1) for i in range(n)]
        self._cache = (key, limits)
        return limits
