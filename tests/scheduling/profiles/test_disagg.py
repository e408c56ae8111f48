"""disagg-profile-handler: llm-d-router's stage order, parameters, fail-closed rule, headers, metrics."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.errors import ConfigError, ServiceUnavailable
from epp.metrics.series import REGISTRY
from epp.plugin.state import CycleState
from epp.request import HeaderMutation
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.profiles.deciders import AlwaysDisaggPDDecider, PrefixBasedPDDecider
from epp.scheduling.profiles.disagg import (
    PEER_ENDPOINT,
    PREFILLER_HOST_PORT_HEADER,
    DisaggParams,
    DisaggProfileHandler,
    parse_stage_order,
)
from epp.scheduling.profiles.disagg_deprecated import DisaggHeadersHandler, PdProfileHandler
from epp.scheduling.scheduler import SchedulingError
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build
from tests.scheduling.profiles.pd_fleet import fleet, pd_scheduler

ALWAYS = "always"


def always() -> AlwaysDisaggPDDecider:
    return build(AlwaysDisaggPDDecider, name=ALWAYS)


def decisions(decision: str, model: str = "m", name: str = "disagg-profile-handler") -> float:
    labels = {"plugin_name": name, "plugin_type": "disagg-profile-handler", "model_name": model}
    return (
        REGISTRY.get_sample_value("llm_d_epp_disagg_decision_total", {**labels, "decision_type": decision})
        or 0.0
    )


def pd_decisions(decision: str, model: str = "m") -> float:
    labels = {"plugin_name": "disagg-profile-handler", "plugin_type": "disagg-profile-handler"}
    return (
        REGISTRY.get_sample_value(
            "llm_d_epp_pd_decision_total", {**labels, "model_name": model, "decision_type": decision}
        )
        or 0.0
    )


def legacy_decisions(decision: str, model: str = "m") -> float:
    return (
        REGISTRY.get_sample_value(
            "llm_d_inference_scheduler_disagg_decision_total",
            {"model_name": model, "decision_type": decision},
        )
        or 0.0
    )


# --- decode-first -------------------------------------------------------------------------
def test_decode_first_picks_decode_then_prefill_and_publishes_the_peer() -> None:
    """Decode runs on decode-capable pods, prefill on prefill-capable ones; the decode pick is the peer."""
    # pod-0 prefill (q0), pod-1 decode (q1), pod-2 unlabelled (q2), pod-3 prefill-decode (q3)
    eps = fleet("prefill", "decode", None, "prefill-decode")
    sched = pd_scheduler(DisaggProfileHandler, [always()], deciders={"prefill": ALWAYS})
    state = CycleState()
    before = decisions("prefill-decode"), pd_decisions("prefill-decode"), legacy_decisions("prefill-decode")
    result = sched.schedule(state, make_request("m"), eps)
    assert result.primary_profile_name == "decode"
    assert result.primary.target_endpoints[0] is eps[1]
    prefill = result.profile_results["prefill"]
    assert prefill is not None
    assert prefill.target_endpoints[0] is eps[0]
    assert state.get(PEER_ENDPOINT) is eps[1]
    assert result.disagg is not None
    assert (result.disagg.decision_type, result.disagg.reason) == ("prefill-decode", "disaggregated")
    assert result.disagg.prefill == "192.168.1.1:8000"
    after = decisions("prefill-decode"), pd_decisions("prefill-decode"), legacy_decisions("prefill-decode")
    assert after == tuple(b + 1 for b in before)


def test_decider_that_declines_runs_decode_only_and_counts_it() -> None:
    """nonCachedTokens 0 never disaggregates: no prefill result, no peer, decision decode-only."""
    decider = build(PrefixBasedPDDecider, name="prefix")
    eps = fleet("prefill", "decode")
    sched = pd_scheduler(DisaggProfileHandler, [decider], deciders={"prefill": "prefix"})
    state = CycleState()
    before = decisions("decode-only"), decisions("prefill-unavailable")
    result = sched.schedule(state, make_request("m"), eps)
    assert set(result.profile_results) == {"decode"}
    assert state.get(PEER_ENDPOINT) is None
    assert result.disagg is not None
    assert (result.disagg.decision_type, result.disagg.reason, result.disagg.prefill) == (
        "decode-only",
        "decider_declined",
        "",
    )
    assert (decisions("decode-only"), decisions("prefill-unavailable")) == (before[0] + 1, before[1])


def test_without_a_prefill_decider_the_prefill_stage_never_runs() -> None:
    eps = fleet("prefill", "decode")
    sched = pd_scheduler(DisaggProfileHandler)
    result = sched.schedule(CycleState(), make_request("m"), eps)
    assert set(result.profile_results) == {"decode"}
    assert result.disagg is not None
    assert result.disagg.reason == "no_prefill_decider"


def test_no_prefill_endpoint_fails_closed_with_503() -> None:
    """The decider said yes, the prefill profile found nothing: 503 prefill_unavailable, never decode-only."""
    eps = fleet("decode", None)  # nothing prefill-capable
    sched = pd_scheduler(DisaggProfileHandler, [always()], deciders={"prefill": ALWAYS})
    before = decisions("prefill-unavailable"), decisions("decode-only"), pd_decisions("prefill-unavailable")
    with pytest.raises(ServiceUnavailable) as err:
        sched.schedule(CycleState(), make_request("m"), eps)
    assert err.value.http_status == 503
    assert err.value.reason == "prefill_unavailable"
    assert "prefill" in err.value.msg
    after = decisions("prefill-unavailable"), decisions("decode-only"), pd_decisions("prefill-unavailable")
    assert after == (before[0] + 1, before[1], before[2] + 1)


def test_no_decode_endpoint_fails_like_llm_d() -> None:
    eps = fleet("prefill", "encode")
    sched = pd_scheduler(DisaggProfileHandler, [always()], deciders={"prefill": ALWAYS})
    with pytest.raises(SchedulingError, match="failed to find available decode workers"):
        sched.schedule(CycleState(), make_request("m"), eps)


def test_empty_model_is_counted_as_unknown() -> None:
    eps = fleet("prefill", "decode")
    sched = pd_scheduler(DisaggProfileHandler, [always()], deciders={"prefill": ALWAYS})
    before = decisions("prefill-decode", model="unknown")
    sched.schedule(CycleState(), make_request(""), eps)
    assert decisions("prefill-decode", model="unknown") == before + 1


# --- prefill-first ------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["prefill-first", "prefill", "PREFILL_FIRST", "prefillFirst"])
def test_prefill_first_runs_prefill_then_decode_with_the_prefill_pick_as_peer(order: str) -> None:
    eps = fleet("prefill", "decode", "prefill", queues=(5, 1, 2))
    sched = pd_scheduler(DisaggProfileHandler, stageOrder=order)
    state = CycleState()
    result = sched.schedule(state, make_request("m"), eps)
    prefill = result.profile_results["prefill"]
    assert prefill is not None
    assert prefill.target_endpoints[0] is eps[2]
    assert state.get(PEER_ENDPOINT) is eps[2]
    assert result.primary.target_endpoints[0] is eps[1]
    assert result.disagg is not None
    assert result.disagg.decision_type == "prefill-decode"


def test_prefill_first_without_prefill_pods_fails_closed() -> None:
    sched = pd_scheduler(DisaggProfileHandler, stageOrder="prefill-first")
    with pytest.raises(ServiceUnavailable):
        sched.schedule(CycleState(), make_request("m"), fleet("decode"))


# --- parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", "decode-first"),
        ("decode", "decode-first"),
        ("Decode_First", "decode-first"),
        ("decodefirst", "decode-first"),
        ("prefill", "prefill-first"),
        ("prefill_first", "prefill-first"),
    ],
)
def test_stage_order_parser(raw: str, expected: str) -> None:
    assert parse_stage_order(raw) == expected


def test_defaults_and_nested_names() -> None:
    p = DisaggParams.model_validate({})
    assert (p.stage_order, p.profiles.decode, p.profiles.prefill, p.profiles.encode) == (
        "decode-first",
        "decode",
        "prefill",
        "encode",
    )
    p = DisaggParams.model_validate(
        {"profiles": {"decode": "d", "prefill": "p"}, "deciders": {"prefill": "x"}}
    )
    assert (p.profiles.decode, p.profiles.prefill, p.profiles.encode, p.deciders.prefill) == (
        "d",
        "p",
        "encode",
        "x",
    )


def test_legacy_flat_names_are_mapped_with_a_deprecation_warning() -> None:
    with capture_logs() as logs:
        p = DisaggParams.model_validate(
            {
                "decodeProfile": "d",
                "prefillProfile": "p",
                "encodeProfile": "e",
                "prefillDeciderPluginName": "pd",
                "deciderPluginName": "ignored-when-the-above-is-set",
                "encodeDeciderPluginName": "ed",
            }
        )
    assert (p.profiles.decode, p.profiles.prefill, p.profiles.encode) == ("d", "p", "e")
    assert (p.deciders.prefill, p.deciders.encode) == ("pd", "ed")
    deprecated = {e.get("parameter") for e in logs if e["event"] == "deprecated_parameter"}
    assert deprecated == {
        "decodeProfile",
        "prefillProfile",
        "encodeProfile",
        "prefillDeciderPluginName",
        "encodeDeciderPluginName",
    }
    assert DisaggParams.model_validate({"deciderPluginName": "old"}).deciders.prefill == "old"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"profiles": {"decode": "d"}, "decodeProfile": "d"}, "use one format exclusively"),
        ({"stageOrder": "sideways"}, "invalid stage order"),
        ({"profiles": {"decoder": "d"}}, "profiles.decoder"),
        ({"stageOrder": "prefill-first", "deciders": {"prefill": "always-disagg-pd-decider"}}, "deciders"),
        ({"deciders": {"prefill": "missing"}}, "deciders.prefill plugin not found: missing"),
        ({"deciders": {"prefill": "max-score-picker"}}, "not a decider"),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_field(parameters: dict[str, Any], message: str) -> None:
    text = CONFIG.replace("PARAMS", repr(parameters).replace("'", '"'))
    with pytest.raises(ConfigError, match=message) as err:
        build_config(load_config(text), default_registry())
    assert "plugins" in str(err.value)


def test_prefill_first_with_prefill_decider_message_is_llm_ds() -> None:
    text = CONFIG.replace(
        "PARAMS", '{"stageOrder": "prefill-first", "deciders": {"prefill": "always-disagg-pd-decider"}}'
    )
    with pytest.raises(ConfigError) as err:
        build_config(load_config(text), default_registry())
    assert "prefill decider is not supported in prefill-first stage order" in str(err.value)
    assert "plugins[1].parameters.deciders" in str(err.value)


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: max-score-picker
- type: disagg-profile-handler
  parameters: PARAMS
- type: always-disagg-pd-decider
- type: decode-filter
- type: prefill-filter
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
"""


def test_decider_listed_after_the_handler_is_resolved() -> None:
    """llm-d resolves plugin references whatever their order in ``plugins``."""
    text = CONFIG.replace("PARAMS", '{"deciders": {"prefill": "always-disagg-pd-decider"}}')
    components = build_config(load_config(text), default_registry())
    handler = components.scheduler.handler
    assert isinstance(handler, DisaggProfileHandler)
    assert handler.pd_decider is components.plugins["always-disagg-pd-decider"]


@pytest.mark.parametrize(
    "type_name", ["pd-profile-handler", "prefill-header-handler", "disagg-headers-handler"]
)
def test_deprecated_types_load_with_a_warning(type_name: str) -> None:
    if type_name == "pd-profile-handler":
        extra = f"- type: {type_name}\n  parameters: {{deciderPluginName: always-disagg-pd-decider}}\n"
        text = CONFIG.replace("- type: disagg-profile-handler\n  parameters: PARAMS\n", extra)
    else:
        text = CONFIG.replace("PARAMS", "{}") + ""
        text = text.replace("- type: decode-filter\n", f"- type: decode-filter\n- type: {type_name}\n")
    with capture_logs() as logs:
        components = build_config(load_config(text), default_registry())
    assert any(e["event"] == "deprecated_plugin_type" and e.get("type") == type_name for e in logs)
    eps = fleet("prefill", "decode")
    result = components.scheduler.schedule(CycleState(), make_request("m"), eps)
    assert result.primary.target_endpoints[0] is eps[1]
    if type_name == "pd-profile-handler":
        assert isinstance(components.scheduler.handler, PdProfileHandler)
        assert result.profile_results["prefill"] is not None


# --- headers --------------------------------------------------------------------------------
def _result(prefill_ep: Any = None) -> SchedulingResult:
    sched = pd_scheduler(DisaggProfileHandler, [always()], deciders={"prefill": ALWAYS})
    eps = [make_endpoint(0, labels={"llm-d.ai/role": "decode"})]
    if prefill_ep is not None:
        eps.append(prefill_ep)
    return sched.schedule(CycleState(), make_request("m"), eps)


def test_prefiller_header_names_the_prefill_pick_and_replaces_a_client_value() -> None:
    handler = build(DisaggProfileHandler)
    result = _result(make_endpoint(1, labels={"llm-d.ai/role": "prefill"}))
    req = make_request("m", headers={PREFILLER_HOST_PORT_HEADER: "10.0.0.66:9999"})
    handler.pre_request(CycleState(), req, result)
    assert PREFILLER_HOST_PORT_HEADER not in req.headers
    assert req.header_mutation is not None
    assert req.header_mutation.set[PREFILLER_HOST_PORT_HEADER] == "192.168.1.2:8000"
    assert PREFILLER_HOST_PORT_HEADER in req.header_mutation.remove  # Envoy removes, then sets


def test_prefiller_header_brackets_ipv6() -> None:
    handler = build(DisaggProfileHandler)
    result = _result(make_endpoint(1, address="fd00::7", port=8200, labels={"llm-d.ai/role": "prefill"}))
    req = make_request("m")
    handler.pre_request(CycleState(), req, result)
    assert req.header_mutation is not None
    assert req.header_mutation.set[PREFILLER_HOST_PORT_HEADER] == "[fd00::7]:8200"


def test_declined_request_strips_a_client_header_and_sets_none() -> None:
    handler = build(DisaggProfileHandler)
    decode = make_endpoint(0)
    result = SchedulingResult({"decode": ProfileRunResult((decode,))}, "decode")
    req = make_request("m", headers={PREFILLER_HOST_PORT_HEADER: "evil:1"})
    handler.pre_request(CycleState(), req, result)
    assert req.header_mutation == HeaderMutation(
        set={}, remove=[PREFILLER_HOST_PORT_HEADER, "x-encoder-hosts-ports"]
    )


def test_deprecated_headers_handler_defers_to_the_profile_handler() -> None:
    """With the disagg handler's decision present the old header plugin changes nothing."""
    result = _result(make_endpoint(1, labels={"llm-d.ai/role": "prefill"}))
    req = make_request("m")
    build(DisaggProfileHandler).pre_request(CycleState(), req, result)
    assert req.header_mutation is not None
    snapshot = (dict(req.header_mutation.set), list(req.header_mutation.remove))
    build(DisaggHeadersHandler).pre_request(CycleState(), req, result)
    assert (req.header_mutation.set, req.header_mutation.remove) == snapshot
