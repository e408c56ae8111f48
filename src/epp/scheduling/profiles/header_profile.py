"""``header-profile-handler`` (llm-d-router): run the one profile a request header names.

For callers that already know which stage of a disaggregated pipeline a request is for (an
external coordinator sends ``EPP-Profile: prefill``, then ``decode``): one EPP instance serves
every stage's profile instead of one instance per stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

import structlog

from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult, SchedulerProfileView, SchedulingResult

log = structlog.get_logger(__name__)

DEFAULT_HEADER: Final = "epp-profile"
DEFAULT_PROFILE: Final = "decode"


class HeaderProfileParams(PluginParams):
    header_name: str = ""
    default_profile: str = ""


class HeaderProfileHandler(PluginBase):
    """Type ``header-profile-handler``.

    Parameters: ``headerName`` (``EPP-Profile``), ``defaultProfile`` (``decode``).  A single
    configured profile always runs.  Otherwise the profile named by the header (trimmed;
    ``defaultProfile`` when absent or empty) runs alone and is primary; a name that is no profile
    runs nothing and the request fails with ``header profile handler: no scheduling profile
    configured for "<header>" header value "<v>"`` (or ``missing "<header>" header``).
    """

    TYPE: ClassVar[str] = "header-profile-handler"
    PARAMS: ClassVar[type[PluginParams]] = HeaderProfileParams

    def __init__(self, name: str, params: HeaderProfileParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.header_name = params.header_name.strip().lower() or DEFAULT_HEADER
        self.default_profile = params.default_profile.strip() or DEFAULT_PROFILE

    def _header(self, request: InferenceRequest) -> str:
        return request.headers.get(self.header_name, "").strip()

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        if results:
            return ()
        if len(profiles) == 1:
            return tuple(profiles)
        wanted = self._header(request) or self.default_profile
        if wanted not in profiles:
            log.info(
                "no_scheduling_profile_selected",
                header=self.header_name,
                resolved=wanted,
                profiles=sorted(profiles),
            )
            return ()
        return (wanted,)

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        if not results:
            value = self._header(request)
            if not value:
                raise ValueError(f'header profile handler: missing "{self.header_name}" header')
            raise ValueError(
                f'header profile handler: no scheduling profile configured for "{self.header_name}" '
                f'header value "{value}"'
            )
        if len(results) > 1:
            raise ValueError(
                f"header profile handler is intended to run a single profile per request, got {len(results)}"
            )
        ((name, result),) = results.items()
        if result is None:
            raise ValueError(f"failed to run scheduler profile '{name}'")
        return SchedulingResult(profile_results=results, primary_profile_name=name)
