"""The director's Screener point (llm-d-router's ``runScreeners``).

Screeners run once per request, after the candidates are located and before the data
producers and every scheduling profile; each sees the same candidates, the director keeps the
intersection, and an empty one is a 503.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.api import Screener
from epp.director.director import Director
from epp.errors import ServiceUnavailable
from epp.plugin.base import NoParams, PluginParams, TypedName
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

BODY = orjson.dumps({"model": "m", "prompt": "hello " * 50, "max_tokens": 5})

PLAIN = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
    "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
)


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
