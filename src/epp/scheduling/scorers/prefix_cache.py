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
        """``score`` times ``weight`` added into ``totals`` in the same pass (the profile's fast path).

        The producer gives every endpoint without a match one shared info object, so the
        weighted score of that object is computed once and the pass only tests identity
        for most endpoints; the float operations, hence the totals, are those of ``score``.
        """
        infos = state.attributes(PREFIX_MATCH)
        n = len(endpoints)
        if not infos:
            zero = 0.0 * weight
            return [zero] * n if totals is None else [t + zero for t in totals]
        get = infos.get
        common = get(endpoints[0])
        if common is not None and common.match_blocks and n > 1:
            common = get(endpoints[-1])  # the first endpoint matched: probe the last one instead
        if common is None:
            c = 0.0 * weight
        else:
            c = (common.match_blocks / common.total_blocks if common.total_blocks > 0 else 0.0) * weight
        if totals is None:
            return [
                c
                if info is common
                else (
                    info.match_blocks / info.total_blocks
                    if info is not None and info.total_blocks > 0
                    else 0.0
                )
                * weight
                for info in map(get, endpoints)
            ]
        return [
            t + c
            if info is common
            else t
            + (info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0)
            * weight
            for t, info in zip(totals, map(get, endpoints), strict=True)
        ]
