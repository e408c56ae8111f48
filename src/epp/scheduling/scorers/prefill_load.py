"""``prefill-load-scorer``: prefer the endpoint with the least prefill work ahead of this request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, prefix_matches
from epp.plugin.base import Handle, NoParams, PluginBase
from epp.plugin.counts import subtract
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, prompt_tokens
from epp.scheduling.api import SchedulingResult, ScorerCategory
from epp.scheduling.normalize import min_max_scores


class _Pending:
    """One request's prefill tokens, held on one endpoint until its first response byte."""

    __slots__ = ("endpoint", "released", "tokens")

    def __init__(self, endpoint: str, tokens: int) -> None:
        self.endpoint = endpoint
        self.tokens = tokens
        self.released = False


class PrefillLoadScorer(PluginBase):
    """Score by the prefill work an endpoint has ahead: tokens it still has to prefill for requests
    this EPP sent it, plus the part of this prompt it does not already hold in its prefix cache.
    Type ``prefill-load-scorer`` (ours; GIE has none), category Balance.

    Time to first token is mostly prefill queued ahead plus this prompt's uncached prefill, so
    one quantity weighs cache affinity against load: a replica holding the prefix wins until
    its backlog costs more than recomputing the prefix elsewhere.  The backlog is the EPP's
    own count, updated at dispatch, so a burst arriving between two metric scrapes does not
    herd onto the replica that looked idle.  ``est = backlog + max(prompt - cached, 0)``;
    scores are min-max normalised, lowest estimate 1.0 (all equal: 1.0 each).

    Consumes: PREFIX_MATCH (cached blocks per endpoint; without it every prompt counts as
    uncached), and reads the precise scorer's PrecisePrefixCacheMatchInfoKey instead when one
    is configured: a prefix the approximate index still remembers but the engine evicted
    costs its full prefill again.  Prompt tokens ≈ body bytes / 4.  A request's tokens leave
    the backlog at its first response body byte (prefill done), or when it ends.
    Parameters: none.
    """

    TYPE: ClassVar[str] = "prefill-load-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE
    BOUNDED: ClassVar[bool] = True
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._backlog: dict[str, int] = {}  # endpoint name -> pending prefill tokens
        self._key: StateKey[_Pending] = StateKey(f"{name}/{self.TYPE}")

    def backlog(self, endpoint: Endpoint) -> int:
        return self._backlog.get(endpoint.name, 0)

    @staticmethod
    def _uncached(state: CycleState, request: InferenceRequest, endpoint: Endpoint) -> int:
        prompt = prompt_tokens(request)
        info = prefix_matches(state).get(endpoint)
        cached = info.match_blocks * info.block_size_tokens if info is not None else 0
        return max(prompt - cached, 0)

    # Scorer ---------------------------------------------------------------------------
    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        backlog = self._backlog
        prompt = prompt_tokens(request)
        infos = prefix_matches(state)
        estimates = []
        for ep in endpoints:
            info = infos.get(ep)
            cached = info.match_blocks * info.block_size_tokens if info is not None else 0
            # ep.metadata.name: ``Endpoint.name`` is a property, a call per endpoint
            estimates.append(backlog.get(ep.metadata.name, 0) + max(prompt - cached, 0))
        return min_max_scores(estimates)

    # PreRequest: the chosen endpoint takes this prompt's uncached prefill -----------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        primary = result.profile_results.get(result.primary_profile_name)
        if primary is None or not primary.target_endpoints:
            return
        target = primary.target_endpoints[0]
        tokens = self._uncached(state, request, target)
        self._backlog[target.name] = self._backlog.get(target.name, 0) + tokens
        state.put(self._key, _Pending(target.name, tokens))

    def _release(self, state: CycleState) -> None:
        pending = state.get(self._key)
        if pending is None or pending.released:
            return
        pending.released = True
        subtract(self._backlog, pending.endpoint, pending.tokens)

    # ResponseBodyProcessor: the first byte means the prefill is done ----------------------
    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None:
        if chunk or response.end_of_stream:
            self._release(state)

    # ResponseCompleteProcessor: release on any end, normal or not --------------------------
    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        self._release(state)

    # EndpointObserver ------------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        return None

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._backlog.pop(endpoint.name, None)
