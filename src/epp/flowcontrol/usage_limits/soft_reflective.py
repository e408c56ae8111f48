"""``soft-reflective-ceiling-policy`` (llm-d-router): lower bands get less of the pool as it fills.

The static policy opens or shuts every band at one threshold, a step.  Here each lower band's
ceiling shrinks with saturation, and a band past its ceiling is opened on one call in
``round(s / (1 - s))``, so its dispatch rate falls smoothly, roughly as ``(1 - s) / s``,
reserving headroom for the bands above it without starving it outright.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.plugin.base import Handle, PluginBase, PluginParams


class SoftReflectiveCeilingPolicy(PluginBase):
    """Type ``soft-reflective-ceiling-policy``; no parameters (upstream refuses any).

    ``priorities`` come highest first; with ``N`` bands and saturation ``s``: band 0 → 1.0 (a
    single band too); band ``i`` → 1.0 while ``s < 1 - i * s / (N - 1)``, 0.0 once ``s >= 1``,
    otherwise open (1.0) on every ``period``-th call and shut (0.0) between, with
    ``period = max(1, round(s / (1 - s + 1e-9)))`` counted on one tick shared by all bands (so
    gated bands open and shut together: the dispatch loop stops at the first gated band).  The
    tick advances only on calls with ``1 - s <= s < 1``.  llm-d-router's ``policy.go``.
    """

    TYPE: ClassVar[str] = "soft-reflective-ceiling-policy"

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.tick = 0

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        s = saturation
        is_open = False
        if 1.0 - s <= s < 1.0:
            # Go's math.Round rounds half away from zero; s / (1 - s) is positive here.
            period = max(1, int(s / (1.0 - s + 1e-9) + 0.5))
            self.tick += 1
            is_open = self.tick % period == 0
        limits = [1.0] * n
        step = s / (n - 1)
        for i in range(1, n):
            if s < 1.0 - i * step:
                continue
            limits[i] = 0.0 if s >= 1.0 or not is_open else 1.0
        return limits
