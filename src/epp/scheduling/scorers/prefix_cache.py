"""``prefix-cache-scorer``: prefer endpoints believed to hold the request's prompt prefix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH
from epp.plugin.base import PluginBase
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class PrefixCacheScorer(PluginBase):
    """Prefer cached prefixes.  Type ``prefix-cache-scorer``, category Affinity.

    score = ``match_blocks / total_blocks`` of the endpoint's ``PrefixMatchInfo``; 0 when
    the info is missing or the prompt has no blocks.  The block hashing and the index live
    in the producer (``approx-prefix-cache-producer``), which is auto-created when no
    configured plugin produces ``PREFIX_MATCH``.
    Consumes: ``PREFIX_MATCH``.  Parameters: none.
    """

    TYPE: ClassVar[str] = "prefix-cache-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]: the profile skips its range check
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(PREFIX_MATCH)
        if not infos:
            return [0.0] * len(endpoints)
        return [
            info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0
            for info in map(infos.get, endpoints)
        ]

    def add_weighted_scores(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        totals: Sequence[float] | None,
        weight: float,
    ) -> list[float]:
        """``score`` times ``weight`` added into ``totals`` in the same pass (the profile's fast path)."""
        infos = state.attributes(PREFIX_MATCH)
        if totals is None:
            if not infos:
                return [0.0 * weight] * len(endpoints)
            return [
                (info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0)
                * weight
                for info in map(infos.get, endpoints)
            ]
        if not infos:
            zero = 0.0 * weight
            return [t + zero for t in totals]
        return [
            t
            + (info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0)
            * weight
            for t, info in zip(totals, map(infos.get, endpoints), strict=True)
        ]
