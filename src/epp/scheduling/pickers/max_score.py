"""``max-score-picker``: the highest totals win; ties are broken uniformly at random."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult
from epp.scheduling.picking import PickerBase


class MaxScorePicker(PickerBase):
    """Return the ``maxNumOfEndpoints`` best-scored endpoints, best first.  Type ``max-score-picker``.

    Equivalent to GIE's shuffle-then-stable-sort: scores descending, and endpoints with
    equal totals in uniformly random order.  Done without shuffling the whole list: one
    ``max`` pass for a single pick, ``heapq.nlargest`` plus a random draw among the
    endpoints tied at the cut for several.
    Consumes nothing.  Parameters: ``maxNumOfEndpoints`` (default 1; ``<= 0`` means 1).
    """

    TYPE: ClassVar[str] = "max-score-picker"

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        n = len(endpoints)
        k = self.max_num_of_endpoints
        rng = self.rng
        if k == 1:
            best = max(scores)
            if scores.count(best) == 1:  # the usual case: a unique best (count: no exception raised)
                return ProfileRunResult((endpoints[scores.index(best)],))
            ties = [i for i, s in enumerate(scores) if s == best]
            return ProfileRunResult((endpoints[ties[rng.randrange(len(ties))]],))
        k = min(k, n)
        top = heapq.nlargest(k, range(n), key=scores.__getitem__)
        cut = scores[top[-1]]
        above = [i for i in top if scores[i] > cut]
        above.sort(key=lambda i: (-scores[i], rng.random()))  # random order within each tie
        at_cut = [i for i, s in enumerate(scores) if s == cut]
        chosen = above + rng.sample(at_cut, k - len(above))
        return ProfileRunResult(tuple(endpoints[i] for i in chosen))
