"""``static-usage-limit-policy``: the same saturation ceiling for every priority."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams


class StaticUsageLimitParams(PluginParams):
    threshold: float = 1.0


class StaticUsageLimitPolicy(PluginBase):
    """Every band may dispatch while pool saturation < ``threshold``.  Type
    ``static-usage-limit-policy``.

    The default (``flowControl.usageLimitPolicyPluginRef``).  A threshold below 1.0 keeps
    headroom in the pool; above 1.0 lets queued work in past the detector's saturation point.
    Parameters: ``threshold`` (1.0, > 0: at 0 nothing would ever dispatch).
    """

    TYPE: ClassVar[str] = "static-usage-limit-policy"
    PARAMS: ClassVar[type[PluginParams]] = StaticUsageLimitParams

    def __init__(self, name: str, params: StaticUsageLimitParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        if not params.threshold > 0.0:
            raise ConfigError(f"threshold must be strictly positive, got {params.threshold:g}")
        self.threshold = params.threshold
        self._limits: tuple[float, ...] = ()

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        if len(self._limits) != len(priorities):
            self._limits = (self.threshold,) * len(priorities)
        return self._limits
