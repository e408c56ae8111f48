"""The director's Screener point (llm-d-router's ``runScreeners``) and the rollout screener on P/D.

Screeners run once per request, after the candidates are located and before the data
producers and every scheduling profile; each sees the same candidates, the director keeps the
intersection, and an empty one is a 503.  On a P/D fleet in mid-rollout the
``disaggregatedset-rollout-screener`` keeps the prefill and the decode pick on one revision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import Components, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datalayer.roles import ROLE_LABEL
from epp.datastore.store import Datastore
from epp.director.api import Screener
from epp.director.director import Director
from epp.director.screeners.disaggregated_rollout import DisaggregatedSetRolloutScreener
from epp.errors import ServiceUnavailable
from epp.plugin.base import NoParams, PluginParams, TypedName
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.profiles.disagg import PREFILLER_HOST_PORT_HEADER

REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"
BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 5})

PLAIN = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
    "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
)

# llm-d's well-lit P/D profiles with the rollout screener listed under plugins (never in a profile).
PD_ROLLOUT = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  name: rollout-screener
  parameters:
    scope:
      labelSelector: "disaggregatedset.x-k8s.io/name=my-set"
    headerSelectors:
    - name: revision
      headerName: x-disagg-revision
      labelKey: disaggregatedset.x-k8s.io/revision
      mode: strict
    revisionGating:
      mode: max-role
      requireRoles:
        values: [prefill, decode]
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: random-picker
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
  - pluginRef: random-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
  - pluginRef: random-picker
"""


def _datastore(labels: Sequence[dict[str, str]]) -> Datastore:
    ds = Datastore()
    for i, pod_labels in enumerate(labels):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}-rank-0",
                address=f"10.0.0.{i + 1}",
                port=8000,
                pod_name=f"pod-{i}",
                namespace="default",
                labels=pod_labels,
            )
        )
    return ds


class Keep:
    """A screener keeping the candidates ``keep`` selects; notes what it was given."""

    TYPE: ClassVar[str] = "keep"
    PARAMS: ClassVar[type[PluginParams]] = NoParams

    def __init__(self, name: str, keep: Callable[[Sequence[Endpoint]], Sequence[Endpoint]]) -> None:
        self.typed_name = TypedName("keep", name)
        self.keep = keep
        self.seen: list[tuple[str, ...]] = []

    def screen(
        self,
        state: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        pool: Sequence[Endpoint],
    ) -> Sequence[Endpoint]:
        self.seen.append(tuple(ep.metadata.pod_name for ep in candidates))
        return self.keep(candidates)


def _director(ds: Datastore, *screeners: Keep) -> Director:
    components = build(load_config(PLAIN), default_registry())
    assert components.request_control.screeners == ()  # nothing configured: the hook is empty
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    return Director(ds, dataclasses.replace(pipeline, screeners=screeners))


async def test_screeners_see_the_same_candidates_and_the_director_keeps_the_intersection() -> None:
    ds = _datastore([{}, {}, {}])
    drop_first = Keep("drop-first", lambda eps: eps[1:])
    keep_last = Keep("keep-last", lambda eps: eps[2:])
    assert isinstance(drop_first, Screener)
    d = _director(ds, drop_first, keep_last)
    decision = await d.start({}, {}).route(BODY)
    assert decision.destination == "10.0.0.3:8000"
    assert drop_first.seen == keep_last.seen == [("pod-0", "pod-1", "pod-2")]  # not the first's output


async def test_an_empty_screen_is_a_503_and_later_screeners_still_see_every_candidate() -> None:
    ds = _datastore([{}, {}])
    empty = Keep("empty", lambda eps: ())
    observe = Keep("observe", lambda eps: eps)
    with pytest.raises(ServiceUnavailable, match="screeners eliminated all endpoint candidates") as err:
        await _director(ds, empty, observe).start({}, {}).route(BODY)
    assert err.value.reason == "rejected-no-endpoints"
    assert err.value.http_status == 503
    assert observe.seen == [("pod-0", "pod-1")]


# --- P/D in mid-rollout -----------------------------------------------------------------------


def _pd_rollout(fleet: Sequence[tuple[str, str]]) -> tuple[Director, Components]:
    """``fleet``: (revision, role) per pod; pods carry llm-d's role label and the set's labels."""
    components = build(load_config(PD_ROLLOUT), default_registry())
    screener = components.plugins.get("rollout-screener")
    assert isinstance(screener, DisaggregatedSetRolloutScreener)
    assert components.request_control.screeners == (screener,)
    assert screener in components.request_control.response_header
    ds = _datastore(
        [
            {ROLE_LABEL: role, ROLE: role, REV: rev, "disaggregatedset.x-k8s.io/name": "my-set"}
            for rev, role in fleet
        ]
    )
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    return Director(ds, pipeline), components


def _revision(ds: Datastore, hostport: str) -> str:
    return next(ep.metadata.labels[REV] for ep in ds.endpoints() if ep.hostport == hostport)


# 2 old prefill + 4 old decode, 1 new prefill + 1 new decode: both revisions covered
MIXED = (("a", "prefill"), ("a", "prefill"), ("a", "decode"), ("a", "decode"), ("a", "decode"), ("a", "decode"),
         ("b", "prefill"), ("b", "decode"))  # fmt: skip


async def test_prefill_and_decode_are_always_picked_from_one_revision() -> None:
    d, _ = _pd_rollout(MIXED)
    ds = d._datastore
    pairs: set[tuple[str, str]] = set()
    for _ in range(200):
        decision = await d.start({}, {}).route(BODY)
        prefiller = dict(decision.headers)[PREFILLER_HOST_PORT_HEADER]
        pairs.add((_revision(ds, prefiller), _revision(ds, decision.destination)))
    # max-role: decode dominates (5), so b gets 1/5 of the requests; both occur, never crossed
    assert pairs == {("a", "a"), ("b", "b")}


async def test_a_revision_without_a_decode_pod_gets_no_request() -> None:
    """Mid-rollout step 3 of the README: the new revision has a prefill pod and no decode yet."""
    d, _ = _pd_rollout((("a", "prefill"), ("a", "decode"), ("b", "prefill"), ("b", "prefill")))
    for _ in range(50):
        decision = await d.start({}, {}).route(BODY)
        assert dict(decision.headers)[PREFILLER_HOST_PORT_HEADER] == "10.0.0.1:8000"
        assert decision.destination == "10.0.0.2:8000"


async def test_strict_header_pins_the_revision_and_the_response_names_it() -> None:
    d, _ = _pd_rollout(MIXED)
    lc = d.start({"x-disagg-revision": "b"}, {})
    decision = await lc.route(BODY)
    assert dict(decision.headers)[PREFILLER_HOST_PORT_HEADER] == "10.0.0.7:8000"
    assert decision.destination == "10.0.0.8:8000"
    added = lc.response_headers({":status": "200"}, end_of_stream=False)
    assert ("x-disagg-revision", "b") in added  # stamped from the serving (decode) endpoint


async def test_uncovered_strict_revision_is_a_503_never_another_revision() -> None:
    d, _ = _pd_rollout((("a", "prefill"), ("a", "decode"), ("b", "prefill")))
    with pytest.raises(ServiceUnavailable, match="screeners eliminated all endpoint candidates"):
        await d.start({"x-disagg-revision": "b"}, {}).route(BODY)


# The plugin README's configuration, verbatim (llm-d-router ships no config file using it).
README_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  name: rollout-screener
  parameters:
    scope:
      labelSelector: "disaggregatedset.x-k8s.io/name=my-set"
    headerSelectors:
    - name: revision
      headerName: x-disagg-revision
      labelKey: disaggregatedset.x-k8s.io/revision
      mode: strict
    - name: slice
      headerName: x-disagg-slice
      labelKey: disaggregatedset.x-k8s.io/slice
      mode: prefer
    revisionGating:
      mode: max-role
      requireRoles:
        values: [prefill, decode]
- type: header-label-affinity-scorer
  name: slice-affinity
  parameters:
    headerName: x-disagg-slice
    labelKey: disaggregatedset.x-k8s.io/slice
- type: weighted-random-picker
  name: picker

schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: slice-affinity
    weight: 3
  - pluginRef: picker
"""


async def test_readme_config_loads_and_stamps_revision_and_slice() -> None:
    components = build(load_config(README_CONFIG), default_registry())
    screener = components.plugins.get("rollout-screener")
    assert isinstance(screener, DisaggregatedSetRolloutScreener)
    slice_label = "disaggregatedset.x-k8s.io/slice"
    ds = _datastore(
        [
            {ROLE: role, REV: "a", slice_label: "s1", "disaggregatedset.x-k8s.io/name": "my-set"}
            for role in ("prefill", "decode")
        ]
    )
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    lc = Director(ds, pipeline).start({}, {})
    await lc.route(BODY)
    added = dict(lc.response_headers({":status": "200"}, end_of_stream=False))
    assert added["x-disagg-revision"] == "a"
    assert added["x-disagg-slice"] == "s1"
