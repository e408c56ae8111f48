"""llm-d-router's deprecated P/D plugin types, accepted so older configs load unchanged.

* ``pd-profile-handler`` (deprecated in llm-d v0.7): the ``disagg-profile-handler`` with its old
  flat parameters; ``deciderPluginName`` defaults to a plugin named ``prefix-based-pd-decider``.
* ``prefill-header-handler`` / ``disagg-headers-handler`` (deprecated in v0.9): PreRequest
  plugins that wrote the P/D headers.  The profile handler writes them itself now, so these
  only strip client values of the headers (harmless twice) and log the deprecation.
"""

from __future__ import annotations

from typing import ClassVar

import structlog
from pydantic import Field

from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult
from epp.scheduling.profiles.disagg import (
    DEFAULT_DECODE,
    DEFAULT_ENCODE,
    DEFAULT_PREFILL,
    PREFILLER_HOST_PORT_HEADER,
    DisaggParams,
    DisaggProfileHandler,
    apply_headers,
)

log = structlog.get_logger(__name__)


class PdProfileHandlerParams(PluginParams):
    decode_profile: str = DEFAULT_DECODE
    prefill_profile: str = DEFAULT_PREFILL
    prefix_plugin_type: str = ""  # read by llm-d's old handler to find the prefix state; unused here
    prefix_plugin_name: str = ""
    primary_port: int = Field(default=0, ge=0, le=0)  # llm-d rewrote decode ports with it; not supported
    decider_plugin_name: str = "prefix-based-pd-decider"
    prefix_match_info_producer_name: str = ""


class PdProfileHandler(DisaggProfileHandler):
    """Deprecated ``pd-profile-handler``: ``disagg-profile-handler`` in decode-first order."""

    TYPE: ClassVar[str] = "pd-profile-handler"
    PARAMS: ClassVar[type[PluginParams]] = PdProfileHandlerParams

    def __init__(self, name: str, params: PdProfileHandlerParams, handle: Handle) -> None:
        log.warning("deprecated_plugin_type", plugin=name, type=self.TYPE, use=DisaggProfileHandler.TYPE)
        nested = DisaggParams.model_validate(
            {
                "profiles": {"decode": params.decode_profile, "prefill": params.prefill_profile},
                "deciders": {"prefill": params.decider_plugin_name},
            }
        )
        super().__init__(name, nested, handle)


class HeadersHandlerParams(PluginParams):
    prefill_profile: str = DEFAULT_PREFILL
    encode_profile: str = DEFAULT_ENCODE


class DisaggHeadersHandler(PluginBase):
    """Deprecated ``disagg-headers-handler``: the profile handler sets the P/D headers now."""

    TYPE: ClassVar[str] = "disagg-headers-handler"
    PARAMS: ClassVar[type[PluginParams]] = HeadersHandlerParams

    def __init__(self, name: str, params: HeadersHandlerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        log.warning("deprecated_plugin_type", plugin=name, type=self.TYPE, use=DisaggProfileHandler.TYPE)
        self.prefill_profile = params.prefill_profile
        self.encode_profile = params.encode_profile

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        if result.disagg is not None:
            return  # the disagg profile handler wrote the headers
        headers: dict[str, str] = {}
        prefill = result.profile_results.get(self.prefill_profile)
        if prefill is not None and prefill.target_endpoints:
            headers[PREFILLER_HOST_PORT_HEADER] = prefill.target_endpoints[0].hostport
        apply_headers(request, headers)


class PrefillHeaderHandler(DisaggHeadersHandler):
    """Deprecated ``prefill-header-handler`` (same as ``disagg-headers-handler``)."""

    TYPE: ClassVar[str] = "prefill-header-handler"
