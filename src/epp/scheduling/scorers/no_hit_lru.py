"""``no-hit-lru-scorer`` (llm-d-router): send requests no cache holds to the least recently used endpoints.

A request whose prefix no candidate holds (a "cold" request) will fill some endpoint's KV
cache with a new prefix; sending such requests round the endpoints that got one longest ago
spreads new prefixes evenly instead of piling them on whichever endpoint the load scorers
currently like.  Requests with a hit score neutrally and leave the order alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult, ScorerCategory

DEFAULT_LRU_SIZE: Final = 1024
PREFILL_PROFILE: Final = "prefill"
MAX_DEBUG_ENDPOINTS: Final = 100


class NoHitLruParams(PluginParams):
    prefix_plugin_type: str = ""  # llm-d's older way to find the prefix state; unused here
    prefix_plugin_name: str = ""
    lru_size: int = DEFAULT_LRU_SIZE
    prefix_match_info_producer_name: str = ""


class NoHitLruScorer(PluginBase):
    """Type ``no-hit-lru-scorer``, category Distribution.

    Cold request (no candidate has ``match_blocks > 0`` in ``PREFIX_MATCH``): with ``n``
    candidates, those never picked for a cold request rank first in candidate order, then the
    others from least to most recently picked (their position in the whole LRU, which may hold
    endpoints that are not candidates); ``score = max(0, 1 - rank / (n - 1))``, a lone
    candidate 1.0.  Warm request: every candidate 0.5.  PreRequest of a cold request moves the
    primary pick, and the ``prefill`` profile's pick, to the most recent end.  The LRU holds at
    most ``lruSize`` endpoint names (1024; <= 0 means the default).  llm-d-router's formula
    and tie-breaking (``no_hit_lru.go``).  Consumes ``PREFIX_MATCH``.
    """

    TYPE: ClassVar[str] = "no-hit-lru-scorer"
    PARAMS: ClassVar[type[PluginParams]] = NoHitLruParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})

    def __init__(self, name: str, params: NoHitLruParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.lru_size = params.lru_size if params.lru_size > 0 else DEFAULT_LRU_SIZE
        self._lru: OrderedDict[str, None] = OrderedDict()  # oldest first, as golang-lru's Keys()
        self._cold: StateKey[bool] = StateKey(f"{name}/{self.TYPE}")

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(PREFIX_MATCH)
        cold = not any(info.match_blocks > 0 for info in map(infos.get, endpoints) if info is not None)
        state.put(self._cold, cold)
        n = len(endpoints)
        if not cold:
            return [0.5] * n
        if n == 1:
            return [1.0]
        position = {key: i for i, key in enumerate(self._lru)} if self._lru else {}
        never = 0
        scores: list[float] = []
        ranks: list[int] = []
        for ep in endpoints:
            pos = position.get(ep.name)
            if pos is None:
                ranks.append(never)
                never += 1
            else:
                ranks.append(-1 - pos)  # resolved below, once the never-used count is known
        span = float(n - 1)
        for r in ranks:
            rank = r if r >= 0 else never + (-1 - r)
            scores.append(max(0.0, 1.0 - rank / span))
        return scores

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        if not state.get(self._cold):
            return
        for profile in (result.primary_profile_name, PREFILL_PROFILE):
            run = result.profile_results.get(profile)
            if run is not None and run.target_endpoints:
                self._touch(run.target_endpoints[0].name)

    def _touch(self, key: str) -> None:
        lru = self._lru
        if key in lru:
            lru.move_to_end(key)
            return
        lru[key] = None
        if len(lru) > self.lru_size:
            lru.popitem(last=False)

    def debug_state(self) -> dict[str, Any]:
        keys = list(self._lru)
        return {
            "endpoints": keys[:MAX_DEBUG_ENDPOINTS],
            "totalEndpoints": len(keys),
            "maxEndpoints": MAX_DEBUG_ENDPOINTS,
        }
