"""disagg-profile-handler's ``declinedProfile`` and the decider's ``dedicatedDecodeOnly`` (ours, not llm-d's)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, PrefixMatchInfo
from epp.errors import ConfigError, ServiceUnavailable
from epp.metrics.series import REGISTRY
from epp.plugin.state import CycleState
from epp.scheduling.filters.by_label import DecodeFilter, PrefillFilter
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider
from epp.scheduling.profiles.disagg import PEER_ENDPOINT, DisaggProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.builders import make_request
from epp.testing.plugins import FakeHandle, build
from tests.scheduling.profiles.pd_fleet import fleet

HANDLER = "disagg-profile-handler"


def declined_total(profile: str, model: str = "m") -> float:
    labels = {"plugin_name": HANDLER, "model_name": model, "profile": profile}
    return REGISTRY.get_sample_value("epp_pd_declined_total", labels) or 0.0


def decode_only_total() -> float:
    labels = {
        "plugin_name": HANDLER,
        "plugin_type": HANDLER,
        "model_name": "m",
        "decision_type": "decode-only",
    }
    return REGISTRY.get_sample_value("llm_d_epp_pd_decision_total", labels) or 0.0


def scheduler(decider: Any, whole_filters: list[Any] | None = None, **params: Any) -> Scheduler:
    """decode (decode-filter), prefill (prefill-filter) and ``whole`` (no role filter), each
    queue-scored; the handler declines into ``whole``."""
    handler = build(
        DisaggProfileHandler,
        handle=FakeHandle([decider]),
        deciders={"prefill": decider.typed_name.name},
        declined_profile="whole",
        **params,
    )
    handler.bind_plugins({decider.typed_name.name: decider}.get)
    picker, queue = build(MaxScorePicker), build(QueueScorer)
    profiles = [
        SchedulerProfile("decode", filters=[build(DecodeFilter)], scorers=[(queue, 1.0)], picker=picker),
        SchedulerProfile("prefill", filters=[build(PrefillFilter)], scorers=[(queue, 1.0)], picker=picker),
        SchedulerProfile("whole", filters=whole_filters or [], scorers=[(queue, 1.0)], picker=picker),
    ]
    return Scheduler(handler, profiles)


def test_declined_request_is_served_whole_by_an_idle_prefill_pod() -> None:
    """The decider declines (nonCachedTokens 0); ``whole`` picks the least-queued pod of all, here
    the prefill pod: it is the only result (so load and prefix go to it), counted and named."""
    eps = fleet("decode", "prefill", "decode", queues=[5, 0, 6])
    sched = scheduler(build(PrefixBasedPDDecider, name="prefix"))
    state = CycleState()
    before = declined_total("whole"), decode_only_total()
    result = sched.schedule(state, make_request("m"), eps)
    assert result.primary_profile_name == "whole"
    assert set(result.profile_results) == {"whole"}  # the decode pick is not served, not accounted
    assert result.primary.target_endpoints[0] is eps[1]
    d = result.disagg
    assert d is not None
    assert (d.decision_type, d.reason, d.prefill, d.declined_profile) == (
        "decode-only",
        "decider_declined",
        "",
        "whole",
    )
    assert state.get(PEER_ENDPOINT) is None  # no prefill stage ran
    assert (declined_total("whole"), decode_only_total()) == (before[0] + 1, before[1] + 1)


def test_the_decider_still_sees_the_decode_pick() -> None:
    """The decision is made on the decode profile's pick, as without declinedProfile."""
    seen: list[Any] = []

    class Spy(PrefixBasedPDDecider):
        def disaggregate(self, state: CycleState, request: Any, endpoint: Any) -> bool:
            seen.append(endpoint)
            return False

    eps = fleet("decode", "prefill", "decode", queues=[5, 0, 6])
    scheduler(build(Spy, name="spy")).schedule(CycleState(), make_request("m"), eps)
    assert seen == [eps[0]]


def test_a_disaggregated_request_never_runs_the_declined_profile() -> None:
    eps = fleet("decode", "prefill", queues=[1, 0])
    result = scheduler(build(AlwaysDisaggPDDecider, name="always")).schedule(
        CycleState(), make_request("m"), eps
    )
    assert set(result.profile_results) == {"decode", "prefill"}
    assert result.primary_profile_name == "decode"
    assert result.disagg is not None
    assert (result.disagg.prefill, result.disagg.declined_profile) == (eps[1].hostport, "")


def test_disaggregate_without_a_prefill_pod_still_fails_closed() -> None:
    """declinedProfile is no availability fallback: the decider said yes, no prefill pod → 503."""
    eps = fleet("decode", None)
    sched = scheduler(build(AlwaysDisaggPDDecider, name="always"))
    before = declined_total("whole")
    with pytest.raises(ServiceUnavailable) as err:
        sched.schedule(CycleState(), make_request("m"), eps)
    assert (err.value.http_status, err.value.reason) == (503, "prefill_unavailable")
    assert declined_total("whole") == before


def test_an_empty_declined_profile_leaves_the_request_on_the_decode_pick() -> None:
    eps = fleet("decode", "prefill", queues=[3, 0])
    sched = scheduler(build(PrefixBasedPDDecider, name="prefix"), whole_filters=[build(PrefillFilter)])
    # whole keeps only prefill pods; drop them from the candidates so it finds nothing
    before = declined_total("decode")
    result = sched.schedule(CycleState(), make_request("m"), eps[:1])
    assert result.primary_profile_name == "decode"
    assert result.primary.target_endpoints[0] is eps[0]
    assert result.disagg is not None
    assert (result.disagg.reason, result.disagg.declined_profile) == ("declined_profile_empty", "")
    assert declined_total("decode") == before + 1


# --- configuration --------------------------------------------------------------------------
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: max-score-picker
- type: disagg-profile-handler
  parameters: PARAMS
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 64}
- type: decode-filter
- type: prefill-filter
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
- name: whole
  plugins: [{pluginRef: max-score-picker}]
"""
DECIDER = {"prefill": "prefix-based-pd-decider"}


def _load(params: dict[str, Any]) -> Any:
    text = CONFIG.replace("PARAMS", repr(params).replace("'", '"'))
    return build_config(load_config(text), default_registry())


def test_a_prefix_the_engine_evicted_gets_a_prefill_leg_from_a_loaded_config() -> None:
    """Through the configured handler: the approximate index says the decode pick holds the
    prompt (stay local); the engines' events say it evicted it, and where a precise scorer wrote
    that, the request is disaggregated."""
    components = _load({"deciders": DECIDER})
    eps = fleet("decode", "prefill")
    request = make_request("m", "x" * 4000)  # ~1,000 prompt tokens
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {ep: PrefixMatchInfo(62, 63, 16) for ep in eps})
    result = components.scheduler.schedule(state, request, eps)
    assert result.disagg is not None
    assert (result.disagg.decision_type, result.disagg.reason) == ("decode-only", "decider_declined")
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {ep: PrefixMatchInfo(62, 63, 16) for ep in eps})
    state.set_attributes(PRECISE_PREFIX_MATCH, {ep: PrefixMatchInfo(0, 63, 16) for ep in eps})
    result = components.scheduler.schedule(state, request, eps)
    assert result.disagg is not None and result.disagg.decision_type == "prefill-decode"
    assert result.primary.target_endpoints[0] is eps[0]


def test_declined_profile_loads() -> None:
    components = _load({"deciders": DECIDER, "declinedProfile": "whole"})
    handler = components.scheduler.handler
    assert isinstance(handler, DisaggProfileHandler)
    assert handler.declined_profile == "whole"


def test_without_declined_profile_nothing_changes() -> None:
    components = _load({"deciders": DECIDER})
    eps = fleet("decode", "prefill")
    result = components.scheduler.schedule(CycleState(), make_request("m", "short"), eps)
    assert result.primary_profile_name == "decode"
    assert result.disagg is not None and result.disagg.declined_profile == ""


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"deciders": DECIDER, "declinedProfile": "missing"},
            "declinedProfile: scheduling profile 'missing'",
        ),
        (
            {"deciders": DECIDER, "declinedProfile": "decode"},
            "declinedProfile 'decode' is the decode profile",
        ),
        ({"deciders": DECIDER, "declinedProfile": "prefill"}, "is the prefill profile"),
        ({"declinedProfile": "whole"}, "declinedProfile needs a prefill decider"),
        ({"stageOrder": "prefill-first", "declinedProfile": "whole"}, "not supported in prefill-first"),
        ({"deciders": DECIDER, "declinedProfile": 3}, "declinedProfile"),
    ],
)
def test_bad_declined_profile_is_a_config_error_naming_the_field(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        _load(params)
    assert "plugins" in str(err.value) and "declinedProfile" in str(err.value)


# --- dedicatedDecodeOnly ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("decode", True),
        (None, True),
        ("prefill-decode", False),
        ("both", False),
        ("encode-prefill-decode", False),
    ],
)
def test_dedicated_decode_only_declines_a_decode_pick_that_also_prefills(
    role: str | None, expected: bool
) -> None:
    decider = build(PrefixBasedPDDecider, non_cached_tokens=16, dedicated_decode_only=True)
    plain = build(PrefixBasedPDDecider, non_cached_tokens=16)
    (ep,) = fleet(role)
    state = CycleState()
    state.set_attributes(PREFIX_MATCH, {ep: PrefixMatchInfo(0, 100, 16)})
    request = make_request("m", "x" * 4000)  # ~1,000 tokens, none cached
    assert plain.disaggregate(state, request, ep) is True
    assert decider.disaggregate(state, request, ep) is expected


def test_dedicated_decode_only_loads_and_rejects_a_non_bool() -> None:
    text = CONFIG.replace("PARAMS", '{"deciders": {"prefill": "prefix-based-pd-decider"}}')
    on = text.replace("{nonCachedTokens: 64}", "{nonCachedTokens: 64, dedicatedDecodeOnly: true}")
    decider = build_config(load_config(on), default_registry()).plugins["prefix-based-pd-decider"]
    assert isinstance(decider, PrefixBasedPDDecider) and decider.dedicated_decode_only
    bad = text.replace("{nonCachedTokens: 64}", "{nonCachedTokens: 64, dedicatedDecodeOnly: maybe}")
    with pytest.raises(ConfigError, match="dedicatedDecodeOnly"):
        build_config(load_config(bad), default_registry())
