"""single-profile-handler: one round, one result, GIE's errors."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import ProfileHandler, ProfileRunResult
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request

MULTI = (
    "single profile handler is intended to be used with a single profile, failed to process multiple profiles"
)


class _View:
    def __init__(self, name: str) -> None:
        self.name = name


def test_pick_runs_every_profile_once() -> None:
    """First round returns all profiles; once each has a result, nothing."""
    handler = build(SingleProfileHandler)
    assert isinstance(handler, ProfileHandler)
    assert SingleProfileHandler.MAX_PROFILES == 1
    profiles = {"default": _View("default")}
    assert list(handler.pick_profiles(CycleState(), request(), profiles, {})) == ["default"]
    done = {"default": ProfileRunResult((endpoint(0),))}
    assert list(handler.pick_profiles(CycleState(), request(), profiles, done)) == []


def test_process_results_primary() -> None:
    """The single result becomes the primary profile."""
    handler = build(SingleProfileHandler)
    ep = endpoint(0)
    result = handler.process_results(CycleState(), request(), {"p": ProfileRunResult((ep,))})
    assert result.primary_profile_name == "p"
    assert result.primary.target_endpoints == (ep,)


@pytest.mark.parametrize(
    ("results", "message"),
    [
        pytest.param({"default": None}, "failed to run scheduler profile 'default'", id="failed-profile"),
        pytest.param(
            {"a": None, "b": None},
            MULTI,
            id="two-profiles",
        ),
        pytest.param(
            {},
            MULTI,
            id="no-profiles",
        ),
    ],
)
def test_process_results_errors(results: dict[str, ProfileRunResult | None], message: str) -> None:
    """Errors carry GIE's text verbatim."""
    handler = build(SingleProfileHandler)
    with pytest.raises(ValueError, match=message):
        handler.process_results(CycleState(), request(), results)
