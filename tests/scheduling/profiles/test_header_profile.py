"""header-profile-handler: llm-d-router's behaviour and messages."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.api import ProfileRunResult
from epp.scheduling.profiles.header_profile import HeaderProfileHandler
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build

PROFILES: dict[str, Any] = {"prefill": object(), "decode": object(), "encode": object()}


def _pick(headers: dict[str, str], profiles: dict[str, Any] = PROFILES, **params: Any) -> tuple[str, ...]:
    handler = build(HeaderProfileHandler, **params)
    return tuple(handler.pick_profiles(CycleState(), make_request(headers=headers), profiles, {}))


def test_header_names_the_profile_default_decode() -> None:
    assert _pick({"epp-profile": " prefill "}) == ("prefill",)
    assert _pick({}) == ("decode",)
    assert _pick({"x-stage": "encode"}, headerName="X-Stage", defaultProfile="prefill") == ("encode",)
    assert _pick({}, headerName="X-Stage", defaultProfile="prefill") == ("prefill",)
    assert _pick({"epp-profile": "nope"}, {"only": object()}) == ("only",)  # a single profile always runs


def test_unknown_or_missing_profile_fails_with_upstreams_message() -> None:
    handler = build(HeaderProfileHandler, defaultProfile="gone")
    assert _pick({"epp-profile": "nope"}) == ()
    with pytest.raises(
        ValueError, match='no scheduling profile configured for "epp-profile" header value "nope"'
    ):
        handler.process_results(CycleState(), make_request(headers={"epp-profile": "nope"}), {})
    with pytest.raises(ValueError, match='missing "epp-profile" header'):
        handler.process_results(CycleState(), make_request(), {})


def test_result_is_the_one_profile_run() -> None:
    handler = build(HeaderProfileHandler)
    ep = make_endpoint(0)
    result = handler.process_results(CycleState(), make_request(), {"prefill": ProfileRunResult((ep,))})
    assert result.primary_profile_name == "prefill"
    with pytest.raises(ValueError, match="failed to run scheduler profile 'prefill'"):
        handler.process_results(CycleState(), make_request(), {"prefill": None})
    assert handler.pick_profiles(CycleState(), make_request(), PROFILES, {"prefill": None}) == ()
