"""``random-picker``: uniformly random endpoints, scores ignored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult
from epp.scheduling.picking import PickerBase, pick_uniform


class RandomPicker(PickerBase):
    """Return ``maxNumOfEndpoints`` endpoints chosen uniformly at random.  Type ``random-picker``.

    Scores are ignored.  Consumes nothing.
    Parameters: ``maxNumOfEndpoints`` (default 1; ``<= 0`` means 1).
    """

    TYPE: ClassVar[str] = "random-picker"

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        return pick_uniform(endpoints, self.max_num_of_endpoints, self.rng)
