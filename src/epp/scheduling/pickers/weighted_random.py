"""``weighted-random-picker``: random endpoints, each as likely as its share of the total score."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult
from epp.scheduling.picking import PickerBase, pick_uniform


class WeightedRandomPicker(PickerBase):
    """Weighted sampling without replacement (A-Res).  Type ``weighted-random-picker``.

    Each endpoint with total ``w > 0`` draws ``key = U ** (1 / w)`` with ``U`` uniform in
    [0, 1) (``U == 0`` becomes ``1e-10``); endpoints with ``w <= 0`` get key 0.  The
    ``maxNumOfEndpoints`` largest keys win, largest first.  When no total is positive it
    falls back to the random picker.
    Consumes nothing.  Parameters: ``maxNumOfEndpoints`` (default 1; ``<= 0`` means 1).
    """

    TYPE: ClassVar[str] = "weighted-random-picker"

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        k = self.max_num_of_endpoints
        if not max(scores) > 0.0:
            return pick_uniform(endpoints, k, self.rng)
        rand = self.rng.random
        keys = [((rand() or 1e-10) ** (1.0 / w)) if w > 0.0 else 0.0 for w in scores]
        if k == 1:
            return ProfileRunResult((endpoints[keys.index(max(keys))],))
        top = heapq.nlargest(min(k, len(keys)), range(len(keys)), key=keys.__getitem__)
        return ProfileRunResult(tuple(endpoints[i] for i in top))
