"""``session-affinity-filter``: pin a conversation to the endpoint that served its last turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final, Literal

from pydantic import Field, model_validator

from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import StateKey
from epp.plugin.state import CycleState
from epp.request import AGENT_IDENTITY, SESSION_ID, InferenceRequest
from epp.scheduling.sessions import ENCODED, SessionAffinity, SessionHooks, SessionSource

SESSION_ID_ATTRIBUTE: Final = "SessionIDDataKey"  # upstream's session-id-producer key
# The request attributes a session id may be read from, by upstream's name.
ATTRIBUTES: Final[dict[str, StateKey[str]]] = {
    AGENT_IDENTITY.name: AGENT_IDENTITY,
    SESSION_ID_ATTRIBUTE: SESSION_ID,
}


class HeaderSource(PluginParams):
    """One place to read the session id from (llm-d: exactly one of ``header``/``attribute``).

    ``attribute`` names a request attribute a plugin published before scheduling: ``agent-identity``
    (the ``agent-identity`` request-header plugin's, producer-agnostic: ``producer`` stays empty)
    or ``SessionIDDataKey`` (``session-id-producer``'s; upstream's key carries the producer's
    name, here one value a request whatever ``producer`` names).
    """

    header: str = ""
    attribute: str = ""
    producer: str = ""

    @model_validator(mode="after")
    def _one(self) -> HeaderSource:
        if bool(self.header) == bool(self.attribute):
            raise ConfigError("sessionIdConfig.sources: exactly one of header or attribute must be set")
        if self.attribute and self.attribute not in ATTRIBUTES:
            raise ConfigError(
                f"sessionIdConfig.sources.attribute: {self.attribute!r} is not a request attribute "
                f"published here; the supported ones are {AGENT_IDENTITY.name!r} (agent-identity) "
                f"and {SESSION_ID_ATTRIBUTE!r} (session-id-producer)"
            )
        if self.attribute == AGENT_IDENTITY.name and self.producer:
            raise ConfigError(
                f"sessionIdConfig.sources.producer: {AGENT_IDENTITY.name!r} is published "
                "producer-agnostic; leave producer empty"
            )
        return self

    def source(self) -> SessionSource:
        return self.header or ATTRIBUTES[self.attribute]


class EncodedEndpointHeaderConfig(PluginParams):
    header: str = "x-session-token"


class SessionIdConfig(PluginParams):
    sources: tuple[HeaderSource, ...] = (HeaderSource(header="x-session-id"),)
    eviction_ttl_seconds: float = Field(300.0, ge=0)
    eviction_sweep_seconds: float = Field(10.0, gt=0)  # accepted; expiry is lazy (sessions.py)
    max_sessions: int = Field(100_000, gt=0)  # this EPP's bound on the store (LRU beyond it)

    def lookup(self) -> list[SessionSource]:
        """The sources in priority order: header names and cycle-state keys."""
        return [s.source() for s in self.sources]


class SessionAffinityFilterParams(PluginParams):
    """llm-d's names and defaults, plus ``skipWhenSaturated`` and ``sessionIdConfig.maxSessions``."""

    strategy: Literal["encoded_endpoint_header", "session_id"] = ENCODED
    profile_name: str = ""
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = Field(
        default_factory=EncodedEndpointHeaderConfig
    )
    session_id_config: SessionIdConfig = SessionIdConfig.model_validate({})
    skip_when_saturated: bool = True


class SessionAffinityFilter(SessionHooks, PluginBase):
    """Keep only the session's endpoint, unless gone or saturated.  Type ``session-affinity-filter``.

    With no session, an unknown or expired one, a session whose endpoint is no longer a
    candidate (gone from the pool, or filtered out before), or whose endpoint is saturated
    by the EPP's saturation detector (``skipWhenSaturated``), the candidates pass through
    unchanged and the other plugins place the request; the session then follows it.  Never
    returns an empty set.
    Strategies (llm-d's): ``encoded_endpoint_header`` (default) reads the endpoint from the
    base64 token in ``encodedEndpointHeaderConfig.header`` (``x-session-token``) and writes
    the chosen endpoint's token on the response; ``session_id`` reads an opaque id from the
    first non-empty source of ``sessionIdConfig.sources`` (a header, or the ``agent-identity`` or
    ``session-id-producer`` attribute) and keeps session -> endpoint in a
    store bounded by ``maxSessions`` (LRU) and ``evictionTtlSeconds`` of idleness.
    Also a PreRequest (binds the session), ResponseHeaderProcessor (writes the token) and
    EndpointObserver (drops the bindings of a removed endpoint).
    """

    TYPE: ClassVar[str] = "session-affinity-filter"
    PARAMS: ClassVar[type[PluginParams]] = SessionAffinityFilterParams

    def __init__(self, name: str, params: SessionAffinityFilterParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        stateful = params.strategy == "session_id"
        token = params.encoded_endpoint_header_config.header
        sid = params.session_id_config
        self.affinity = SessionAffinity(
            handle,
            self,
            stateful=stateful,
            sync_key=f"{self.TYPE}/{name}",
            headers=sid.lookup() if stateful else [token],
            response_header=token,
            profile_name=params.profile_name,
            skip_when_saturated=params.skip_when_saturated,
            max_sessions=sid.max_sessions,
            ttl=sid.eviction_ttl_seconds,
        )

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        ep = self.affinity.bound(request, endpoints, state)
        return endpoints if ep is None else [ep]
