"""``session-id-producer`` (llm-d-router): the request's session id, from a header or a cookie.

llm-d-router publishes it as the request's ``SessionID`` attribute so session-aware plugins need
not know where a deployment carries it.  Here it is the cycle state's ``SESSION_ID`` value, which
the session-affinity plugins read through ``sessionIdConfig.sources[]`` ``{attribute:
SessionIDDataKey, producer: <this plugin's name>}``, as upstream's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import model_validator

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import SESSION_ID as SESSION_ID
from epp.request import InferenceRequest


def cookie_value(header: str, name: str) -> str:
    """The first ``name=value`` pair of a ``Cookie`` header, as upstream splits it (``;``, trimmed)."""
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


class SessionIdParams(PluginParams):
    header_name: str = ""
    cookie_name: str = ""

    @model_validator(mode="after")
    def _exactly_one(self) -> SessionIdParams:
        header, cookie = self.header_name.strip(), self.cookie_name.strip()
        if not header and not cookie:
            raise ValueError(
                "'session-id-producer' requires exactly one of headerName or cookieName to be set"
            )
        if header and cookie:
            raise ValueError(
                "'session-id-producer' requires exactly one of headerName or cookieName to be set, not both"
            )
        return self


class SessionIdProducer(PluginBase):
    """Type ``session-id-producer``.  Parameters: exactly one of ``headerName`` (case-insensitive)
    and ``cookieName`` (a cookie of the ``Cookie`` header).  Puts the trimmed, non-empty value
    under ``SESSION_ID`` in the cycle state; nothing when absent."""

    TYPE: ClassVar[str] = "session-id-producer"
    PARAMS: ClassVar[type[PluginParams]] = SessionIdParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()  # a request-level value
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()

    def __init__(self, name: str, params: SessionIdParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.header_name = params.header_name.strip().lower()
        self.cookie_name = params.cookie_name.strip()

    def session_id(self, request: InferenceRequest) -> str:
        if self.header_name:
            return request.headers.get(self.header_name, "").strip()
        return cookie_value(request.headers.get("cookie", ""), self.cookie_name).strip()

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        self.prepare_request_data_now(state, request, endpoints)

    def prepare_request_data_now(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        """Never waits: the director calls this without a coroutine (director.api.ImmediateProducer)."""
        value = self.session_id(request)
        if value:
            state.put(SESSION_ID, value)
