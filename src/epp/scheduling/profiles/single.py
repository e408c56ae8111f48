"""``single-profile-handler``: run the one configured profile; its result is primary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ProfileRunResult, SchedulerProfileView, SchedulingResult, only_result


class SingleProfileHandler(PluginBase):
    """Run every profile once and make the only one primary.  Type ``single-profile-handler``.

    Pick returns all profiles until each has a result (so, one round).  ProcessResults
    requires exactly one result and fails with GIE's messages otherwise: ``single profile
    handler is intended to be used with a single profile, failed to process multiple
    profiles``, or ``failed to run scheduler profile '<name>'`` when that profile failed.
    Consumes nothing.  Parameters: none.  ``MAX_PROFILES`` tells the config builder that a
    second profile is a configuration error.
    """

    TYPE: ClassVar[str] = "single-profile-handler"
    MAX_PROFILES: ClassVar[int | None] = 1

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        if len(profiles) == len(results):
            return ()
        return tuple(profiles)

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        name, _ = only_result(results, "single profile handler")
        return SchedulingResult(profile_results=results, primary_profile_name=name)
