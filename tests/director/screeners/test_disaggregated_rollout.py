"""disaggregatedset-rollout-screener: llm-d-router's config, plugin and screener test vectors.

Upstream seeds its pod cache from Pod notifications; here the same counts are pool endpoints
(the datastore's Ready pods), which is where this plugin reads them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from epp.app.registry import default_registry
from epp.datalayer.api import Endpoint
from epp.director.api import ResponseHeaderProcessor, Screener
from epp.director.screeners.disaggregated_rollout import (
    DEFAULT_REVISION_LABEL,
    DEFAULT_ROLE_LABEL,
    DisaggregatedSetRolloutParams,
    DisaggregatedSetRolloutScreener,
    dominant_role,
    pick_weighted_revision,
    revision_sum_weight,
)
from epp.metrics.series import REGISTRY
from epp.plugin.state import CycleState
from epp.request import ResponseInfo
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build

REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"
SET = "disaggregatedset.x-k8s.io/name"
SELECTOR = "disaggregatedset.x-k8s.io/name=my-set"


def valid_config(**changes: Any) -> dict[str, Any]:
    """Upstream's validConfig (camelCase), with top-level keys replaced by ``changes``."""
    config: dict[str, Any] = {
        "scope": {"labelSelector": SELECTOR},
        "headerSelectors": [
            {"name": "revision", "headerName": "x-disagg-revision", "labelKey": REV, "mode": "strict"}
        ],
        "revisionGating": {
            "revisionLabelKey": REV,
            "roleLabelKey": ROLE,
            "mode": "sum",
            "requireRoles": {"values": ["prefill", "decode"]},
        },
    }
    config.update(changes)
    return config


def gating(mode: str, **extra: Any) -> dict[str, Any]:
    return {"mode": mode, "requireRoles": {"values": ["prefill", "decode"]}, **extra}


def screener(config: dict[str, Any] | None = None, seed: int = 0) -> DisaggregatedSetRolloutScreener:
    params = DisaggregatedSetRolloutParams.model_validate(config or valid_config())
    return DisaggregatedSetRolloutScreener("test-screener", params, FakeHandle(), rng=random.Random(seed))


class Fleet:
    """Pool endpoints, numbered in order of creation (pod-<i> at 192.168.1.<i+1>)."""

    def __init__(self) -> None:
        self.endpoints: list[Endpoint] = []

    def pod(self, revision: str, role: str, *, in_set: bool = True) -> Endpoint:
        labels = {REV: revision, ROLE: role, SET: "my-set" if in_set else "other"}
        ep = make_endpoint(len(self.endpoints), labels=labels)
        self.endpoints.append(ep)
        return ep

    def counts(self, counts: Mapping[str, Mapping[str, int]]) -> Fleet:
        for revision, roles in counts.items():
            for role, n in roles.items():
                for _ in range(n):
                    self.pod(revision, role)
        return self


def screen(
    plugin: DisaggregatedSetRolloutScreener,
    candidates: Sequence[Endpoint],
    pool: Sequence[Endpoint],
    headers: dict[str, str] | None = None,
) -> Sequence[Endpoint]:
    return plugin.screen(CycleState(), make_request(headers=headers or {}), candidates, pool)


def revisions(endpoints: Sequence[Endpoint]) -> set[str]:
    return {ep.metadata.labels[REV] for ep in endpoints}


# --- config (upstream's config_test.go) --------------------------------------------------------


def test_valid_config_is_accepted_and_is_both_a_screener_and_a_response_header_processor() -> None:
    plugin = screener()
    assert isinstance(plugin, Screener)
    assert isinstance(plugin, ResponseHeaderProcessor)
    assert "disaggregatedset-rollout-screener" in default_registry()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (valid_config(scope={"labelSelector": ""}), "scope.labelSelector is required"),
        (valid_config(scope={"labelSelector": "not a valid selector!!"}), "scope.labelSelector"),
        (valid_config(headerSelectors=[{"headerName": "x", "labelKey": "k", "mode": "strict"}]), "headerSelectors[0].name"),
        (valid_config(headerSelectors=[{"name": "n", "labelKey": "k", "mode": "strict"}]), "headerSelectors[0].headerName"),
        (valid_config(headerSelectors=[{"name": "n", "headerName": "x", "mode": "strict"}]), "headerSelectors[0].labelKey"),
        (valid_config(headerSelectors=[{"name": "n", "headerName": "x", "labelKey": "k", "mode": "loose"}]), "mode"),
        (
            valid_config(headerSelectors=[
                {"name": "revision", "headerName": "x-disagg-revision", "labelKey": REV, "mode": "strict"},
                {"name": "revision", "headerName": "x-disagg-other", "labelKey": "foo", "mode": "strict"},
            ]),
            "duplicate name",
        ),
        (
            valid_config(headerSelectors=[
                {"name": "revision", "headerName": "x-disagg-revision", "labelKey": REV, "mode": "strict"},
                {"name": "other", "headerName": "X-Disagg-Revision", "labelKey": "foo", "mode": "strict"},
            ]),
            "duplicate headerName",
        ),
        (valid_config(revisionGating={"mode": "sum", "requireRoles": {"values": []}}), "revisionGating.requireRoles.values"),
        (valid_config(revisionGating=gating("sum") | {"requireRoles": {"values": ["prefill", "prefill"]}}), "duplicate role"),
        (valid_config(revisionGating=gating("sum") | {"requireRoles": {"values": ["prefill", ""]}}), "values[1] must not be empty"),
        (valid_config(revisionGating=None), "revisionGating is required"),
        ({"scope": {"labelSelector": SELECTOR}}, "revisionGating is required"),
        (valid_config(revisionGating={"mode": "bogus"}), "mode"),
        (valid_config(revisionGating={"mode": "sum"}), "revisionGating.requireRoles is required when revisionGating.mode=sum"),
        (valid_config(revisionGating={"mode": "max-role"}), "revisionGating.requireRoles is required"),
        (valid_config(headerSelectors=[{"name": "n", "headerName": "x", "labelKey": "k", "mode": "strict", "unknown": 1}]), "unknown"),
    ],
)  # fmt: skip
def test_invalid_config_is_rejected_with_upstreams_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        DisaggregatedSetRolloutParams.model_validate(config)
    assert message in str(err.value) or message.lower() in str(err.value).lower()


def test_optional_parts_validate_and_label_keys_default() -> None:
    DisaggregatedSetRolloutParams.model_validate(valid_config(headerSelectors=[]))  # gating-only
    DisaggregatedSetRolloutParams.model_validate(valid_config(revisionGating=gating("max-role")))
    disabled = DisaggregatedSetRolloutParams.model_validate(valid_config(revisionGating={"mode": "disabled"}))
    assert disabled.revision_gating is not None and not disabled.revision_gating.active
    empty = DisaggregatedSetRolloutParams.model_validate(
        valid_config(revisionGating=gating("sum", revisionLabelKey="", roleLabelKey=""))
    )
    assert empty.revision_gating is not None
    assert empty.revision_gating.revision_label_key == DEFAULT_REVISION_LABEL == REV
    assert empty.revision_gating.role_label_key == DEFAULT_ROLE_LABEL == ROLE
    one_role = DisaggregatedSetRolloutParams.model_validate(
        valid_config(revisionGating={"mode": "sum", "requireRoles": {"values": ["r"]}})
    )
    assert one_role.revision_gating is not None and one_role.revision_gating.active


def test_header_name_is_lower_cased_at_parse_time() -> None:
    params = DisaggregatedSetRolloutParams.model_validate(
        valid_config(headerSelectors=[{"name": "revision", "headerName": "X-Disagg-Revision", "labelKey": "lk", "mode": "strict"}])
    )  # fmt: skip
    assert params.header_selectors[0].header_name == "x-disagg-revision"


# --- coverage and weights (upstream's plugin_test.go) ------------------------------------------


def test_pool_counts_only_pods_in_scope_with_both_labels_and_each_pod_once() -> None:
    fleet = Fleet()
    fleet.pod("v1", "prefill")
    fleet.pod("v2", "decode", in_set=False)  # outside the scope selector
    fleet.endpoints.append(make_endpoint(9, labels={SET: "my-set", REV: "v1"}))  # no role label
    rank1 = make_endpoint(0, labels={REV: "v1", ROLE: "prefill", SET: "my-set"})  # pod-0's second rank
    fleet.endpoints.append(rank1)
    counts = screener().distribution_of(fleet.endpoints).role_counts
    assert counts == {"v1": {"prefill": 1}}


def test_pool_changes_refresh_shares() -> None:
    plugin = screener()
    fleet = Fleet().counts({"v1": {"prefill": 2, "decode": 2}, "v2": {"prefill": 1, "decode": 1}})
    assert plugin.distribution_of(fleet.endpoints).shares == pytest.approx({"v1": 2 / 3, "v2": 1 / 3})
    moved = fleet.endpoints[2]  # a v1 decode relabelled v2 in place (the datastore replaces metadata)
    moved.metadata = replace(moved.metadata, labels={**moved.metadata.labels, REV: "v2"})
    assert plugin.distribution_of(fleet.endpoints).shares == pytest.approx({"v1": 1 / 2, "v2": 1 / 2})
    pool = [ep for ep in fleet.endpoints if ep is not moved]  # it went unready: out of the pool
    assert plugin.distribution_of(pool).shares == pytest.approx({"v1": 3 / 5, "v2": 2 / 5})


def test_revision_sum_weight_and_coverage() -> None:
    assert revision_sum_weight({"prefill": 2, "decode": 8}, ["prefill", "decode"]) == 10
    assert revision_sum_weight({"decode": 8}, ["prefill", "decode"]) is None


def test_dominant_role_uses_counts_across_covered_revisions() -> None:
    covered = {"v1": {"prefill": 8, "decode": 1}, "v2": {"prefill": 2, "decode": 4}}
    assert dominant_role(covered, ["prefill", "decode"]) == "prefill"
    assert dominant_role(covered, ["decode", "prefill"]) == "prefill"
    tied = {"v1": {"prefill": 8, "decode": 2}, "v2": {"prefill": 2, "decode": 8}}
    assert dominant_role(tied, ["prefill", "decode"]) == "prefill"  # the first listed wins a tie


SHARE_CASES = [
    ("2p10d sum", "sum", {"v1": {"prefill": 2, "decode": 8}, "v2": {"prefill": 1, "decode": 2}}, 3 / 13),
    ("2p10d max role", "max-role", {"v1": {"prefill": 2, "decode": 8}, "v2": {"prefill": 1, "decode": 2}}, 2 / 10),
    ("10p10d sum", "sum", {"v1": {"prefill": 8, "decode": 8}, "v2": {"prefill": 2, "decode": 2}}, 2 / 10),
    ("10p10d max role", "max-role", {"v1": {"prefill": 8, "decode": 8}, "v2": {"prefill": 2, "decode": 2}}, 2 / 10),
    ("10p2d sum", "sum", {"v1": {"prefill": 8, "decode": 2}, "v2": {"prefill": 2, "decode": 1}}, 3 / 13),
    ("10p2d max role", "max-role", {"v1": {"prefill": 8, "decode": 2}, "v2": {"prefill": 2, "decode": 1}}, 2 / 10),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "counts", "want_v2"),
    [pytest.param(*c[1:], id=c[0]) for c in SHARE_CASES]
    + [
        pytest.param(
            "max-role", {"v1": {"prefill": 8, "decode": 1}, "v2": {"prefill": 2, "decode": 4}}, 2 / 10,
            id="max role is shared across revisions",
        ),
        pytest.param(
            "max-role",
            {"v1": {"prefill": 2, "decode": 8}, "v2": {"prefill": 1, "decode": 2}, "v3": {"prefill": 100}},
            2 / 10,
            id="max role ignores incomplete revisions",
        ),
    ],
)  # fmt: skip
def test_revision_modes_give_upstreams_shares(
    mode: str, counts: dict[str, dict[str, int]], want_v2: float
) -> None:
    plugin = screener(valid_config(revisionGating=gating(mode)))
    shares = plugin.distribution_of(Fleet().counts(counts).endpoints).shares
    assert shares["v2"] == pytest.approx(want_v2)
    assert shares["v1"] == pytest.approx(1 - want_v2)
    assert "v3" not in shares


def test_readme_example_2p10d() -> None:
    """README: A = 2P + 9D, B = 1P + 1D; max-role 90/10 (decode dominates), sum 11/13."""
    counts = {"A": {"prefill": 2, "decode": 9}, "B": {"prefill": 1, "decode": 1}}
    pool = Fleet().counts(counts).endpoints
    assert screener(valid_config(revisionGating=gating("max-role"))).distribution_of(
        pool
    ).shares == pytest.approx({"A": 0.9, "B": 0.1})
    assert screener().distribution_of(pool).shares == pytest.approx({"A": 11 / 13, "B": 2 / 13})


def test_pick_weighted_revision() -> None:
    shares = {"v1": 0.75, "v2": 0.25}
    assert pick_weighted_revision(shares, 0) == "v1"
    assert pick_weighted_revision(shares, 0.9) == "v2"
    assert pick_weighted_revision({}, 0.5) == ""


# --- Screen ----------------------------------------------------------------------------------


def test_pinned_uncovered_revision_fails_closed() -> None:
    fleet = Fleet().counts({"v1": {"prefill": 3}, "v2": {"prefill": 1, "decode": 1}})
    candidates = [fleet.endpoints[0], fleet.endpoints[3]]  # a v1 and a v2 prefill
    assert screen(screener(), candidates, fleet.endpoints, {"x-disagg-revision": "v1"}) == ()


def test_single_revision_still_checks_cross_role_coverage() -> None:
    fleet = Fleet().counts({"v1": {"prefill": 2}})
    assert screen(screener(), fleet.endpoints[:1], fleet.endpoints) == ()


def test_fails_closed_while_the_pool_is_empty() -> None:
    """Upstream: no Pod notification yet.  Here: candidates the pool does not (yet) hold."""
    fleet = Fleet().counts({"v1": {"prefill": 1, "decode": 1}})
    assert screen(screener(), fleet.endpoints, []) == ()


def test_without_a_header_one_revision_survives_and_keeps_all_its_roles() -> None:
    fleet = Fleet().counts({"v1": {"prefill": 2, "decode": 2}, "v2": {"prefill": 1, "decode": 1}})
    got = screen(screener(), fleet.endpoints, fleet.endpoints)
    assert len(revisions(got)) == 1
    (rev,) = revisions(got)
    assert {ep.metadata.labels[ROLE] for ep in got} == {"prefill", "decode"}
    assert len(got) == sum(1 for ep in fleet.endpoints if ep.metadata.labels[REV] == rev)


@pytest.mark.parametrize(("mode", "counts", "want_v2"), [pytest.param(*c[1:], id=c[0]) for c in SHARE_CASES])
def test_weighted_distribution(mode: str, counts: dict[str, dict[str, int]], want_v2: float) -> None:
    plugin = screener(valid_config(revisionGating=gating(mode)), seed=7)
    pool = Fleet().counts(counts).endpoints
    candidates = [ep for ep in pool if ep.metadata.labels[ROLE] == "prefill"]
    iterations = 10_000
    v2 = 0
    for _ in range(iterations):
        got = screen(plugin, candidates, pool)
        assert got
        v2 += got[0].metadata.labels[REV] == "v2"
    assert abs(v2 / iterations - want_v2) <= 0.03


def test_strict_selectors_with_gating_disabled() -> None:
    plugin = screener(valid_config(revisionGating={"mode": "disabled"}))
    fleet = Fleet()
    v1, v2 = fleet.pod("v1", "prefill"), fleet.pod("v2", "prefill")
    assert list(screen(plugin, [v1, v2], fleet.endpoints, {"x-disagg-revision": "v2"})) == [v2]
    assert list(screen(plugin, [v1, v2], fleet.endpoints)) == [v1, v2]  # no header: all go on
    labels = {"plugin_type": plugin.TYPE, "plugin_name": "test-screener", "selector": "revision"}
    before = (
        REGISTRY.get_sample_value("llm_d_epp_disaggregatedset_strict_header_no_match_total", labels) or 0.0
    )
    assert screen(plugin, [v1, v2], fleet.endpoints, {"x-disagg-revision": "missing"}) == ()
    after = REGISTRY.get_sample_value("llm_d_epp_disaggregatedset_strict_header_no_match_total", labels)
    assert after == before + 1


def test_strict_header_pins_a_covered_revision_without_a_draw() -> None:
    fleet = Fleet().counts({"v1": {"prefill": 9, "decode": 9}, "v2": {"prefill": 1, "decode": 1}})
    plugin = screener()
    for _ in range(20):  # v2 holds a tenth of the weight; the header must win every time
        assert revisions(screen(plugin, fleet.endpoints, fleet.endpoints, {"x-disagg-revision": "v2"})) == {
            "v2"
        }


def test_share_gauge_follows_the_pool_and_drops_a_gone_revision() -> None:
    plugin = build(DisaggregatedSetRolloutScreener, "gauge-screener", **valid_config())
    fleet = Fleet().counts({"v1": {"prefill": 1, "decode": 3}, "v2": {"prefill": 1}})
    plugin.distribution_of(fleet.endpoints)

    def share(rev: str) -> float | None:
        labels = {"plugin_type": plugin.TYPE, "plugin_name": "gauge-screener", "mode": "sum", "revision": rev}
        return REGISTRY.get_sample_value("llm_d_epp_disaggregatedset_revision_gating_share", labels)

    assert share("v1") == 1.0
    assert share("v2") == 0.0  # incomplete: reported, with share 0
    plugin.distribution_of(fleet.endpoints[:4])  # v2's prefill left the pool
    assert share("v2") is None


# --- ResponseHeader ----------------------------------------------------------------------------


@pytest.mark.parametrize("gating_config", [gating("sum"), {"mode": "disabled"}], ids=["sum", "disabled"])
def test_response_header_stamps_every_selector(gating_config: dict[str, Any]) -> None:
    plugin = screener(valid_config(
        revisionGating=gating_config,
        headerSelectors=[
            {"name": "revision", "headerName": "x-disagg-revision", "labelKey": REV, "mode": "strict"},
            {"name": "slice", "headerName": "X-Disagg-Slice", "labelKey": "disaggregatedset.x-k8s.io/slice", "mode": "prefer"},
        ],
    ))  # fmt: skip
    target = make_endpoint(0, labels={REV: "v1", ROLE: "decode"})  # no slice label: not stamped
    response = ResponseInfo(request_id="r")
    plugin.response_header(CycleState(), make_request(), response, target)
    assert response.headers == {"x-disagg-revision": "v1"}
    plugin.response_header(CycleState(), make_request(), response, None)  # no target: nothing
    assert response.headers == {"x-disagg-revision": "v1"}
