"""``session-affinity-scorer``: prefer the endpoint that served the session's last turn."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory
from epp.scheduling.filters.session_affinity import EncodedEndpointHeaderConfig, SessionIdConfig
from epp.scheduling.sessions import ENCODED, SessionAffinity, SessionHooks, SessionSource, find


class SessionAffinityScorerParams(PluginParams):
    """llm-d's names and defaults, plus ``maxSessions`` and ``skipWhenSaturated``."""

    algorithm: Literal["encoded_endpoint_header", "session_id_header"] = ENCODED
    header_name: str = "x-session-token"
    profile_name: str = ""
    eviction_ttl_seconds: float = Field(600.0, ge=0)
    eviction_sweep_seconds: float = Field(30.0, gt=0)  # accepted; expiry is lazy (sessions.py)
    miss_threshold: int = Field(3, ge=1)  # accepted; a session rebinds on its first miss
    max_sessions: int = Field(100_000, gt=0)
    skip_when_saturated: bool = True
    # llm-d-router v0.10's form, the filter's: when ``strategy`` is set it wins over the above.
    strategy: Literal["encoded_endpoint_header", "session_id"] | None = None
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = Field(
        default_factory=EncodedEndpointHeaderConfig
    )
    session_id_config: SessionIdConfig = SessionIdConfig.model_validate({})


class SessionAffinityScorer(SessionHooks, PluginBase):
    """1.0 for the session's endpoint, 0.0 for the others.  Type ``session-affinity-scorer``, Affinity.

    A soft pin: the weight decides how much it outweighs load and prefix scorers.  While the
    session's endpoint is saturated by the EPP's saturation detector (``skipWhenSaturated``)
    every candidate scores 0.0: the other scorers place that turn.  Under ``session_id_header``
    a new session, or one whose endpoint is no longer a candidate, scores 1.0 on the candidate
    bound by the fewest sessions (ties rotate; saturated ones only when every one is), as llm-d
    does, so new conversations spread; under ``encoded_endpoint_header`` it scores all 0.0.
    The session is bound to (or its token names) the endpoint finally picked.  Parameters:
    ``algorithm`` (``encoded_endpoint_header`` | ``session_id_header``), ``headerName``
    (``x-session-token``), ``profileName``, ``evictionTtlSeconds`` (600), ``maxSessions``
    (100000), ``skipWhenSaturated`` (true); ``evictionSweepSeconds`` and ``missThreshold`` are
    accepted for llm-d configs and have no effect.  llm-d-router v0.10 configures the scorer like
    the filter: ``strategy`` (``encoded_endpoint_header`` | ``session_id``),
    ``encodedEndpointHeaderConfig.header``, ``sessionIdConfig`` (sources, TTL); when ``strategy``
    is set those win.
    """

    TYPE: ClassVar[str] = "session-affinity-scorer"
    PARAMS: ClassVar[type[PluginParams]] = SessionAffinityScorerParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: SessionAffinityScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        headers: list[SessionSource]
        if params.strategy is None:  # llm-d-router <= v0.9's form
            stateful = params.algorithm == "session_id_header"
            headers, token = [params.header_name], params.header_name
            max_sessions, ttl = params.max_sessions, params.eviction_ttl_seconds
        else:  # v0.10's, the filter's
            stateful = params.strategy == "session_id"
            sid, token = params.session_id_config, params.encoded_endpoint_header_config.header
            headers = sid.lookup() if stateful else [token]
            max_sessions, ttl = sid.max_sessions, sid.eviction_ttl_seconds
        self.affinity = SessionAffinity(
            handle,
            self,
            stateful=stateful,
            sync_key=f"{self.TYPE}/{name}",
            headers=headers,
            response_header=token,
            profile_name=params.profile_name,
            skip_when_saturated=params.skip_when_saturated,
            max_sessions=max_sessions,
            ttl=ttl,
        )
        self._cursor = itertools.count()

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        out = [0.0] * len(endpoints)
        if not endpoints:
            return out
        a = self.affinity
        target = find(endpoints, a.bound_name(request, state))
        if target is not None:
            if a.released(target):
                # saturated: the pin is released, and the turn is left to the other scorers (its
                # context is still cached there; pushing it to the least-bound endpoint would pay
                # a full prefill elsewhere whatever they say)
                return out
        elif a.stateful and a.session(request, state):
            target = self._least_bound(endpoints)
        if target is not None:
            out[endpoints.index(target)] = 1.0
        return out

    def _least_bound(self, endpoints: Sequence[Endpoint]) -> Endpoint:
        a = self.affinity
        # a new session is not placed on a saturated endpoint (unless every one is)
        endpoints = [ep for ep in endpoints if not a.released(ep)] or endpoints
        counts = a.bindings.sessions_on
        fewest = min(counts(ep.name) for ep in endpoints)
        tied = sorted((ep for ep in endpoints if counts(ep.name) == fewest), key=lambda ep: ep.name)
        return tied[next(self._cursor) % len(tied)]
