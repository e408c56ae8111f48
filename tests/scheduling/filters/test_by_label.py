"""Role filters (llm-d's value table), label-selector-filter and the deprecated by-label."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from epp.datalayer.roles import ROLE_LABEL
from epp.plugin.state import CycleState
from epp.scheduling.api import Filter
from epp.scheduling.filters.by_label import (
    ByLabelFilter,
    ByLabelSelectorFilter,
    DecodeFilter,
    EncodeFilter,
    LabelSelectorFilter,
    PrefillFilter,
)
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build

ROLES = (
    None,
    "decode",
    "prefill",
    "encode",
    "prefill-decode",
    "both",
    "encode-prefill",
    "encode-prefill-decode",
    "x",
)


def _kept(f: Filter) -> set[str | None]:
    eps = [make_endpoint(i, labels={} if r is None else {ROLE_LABEL: r}) for i, r in enumerate(ROLES)]
    return {
        ROLES[int(ep.metadata.pod_name.split("-")[1])] for ep in f.filter(CycleState(), make_request(), eps)
    }


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (DecodeFilter, {None, "decode", "prefill-decode", "both", "encode-prefill-decode"}),
        (PrefillFilter, {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}),
        (EncodeFilter, {"encode", "encode-prefill", "encode-prefill-decode"}),
    ],
)
def test_role_table(cls: Any, expected: set[str | None]) -> None:
    f = build(cls)
    assert isinstance(f, Filter)
    assert _kept(f) == expected


def test_filters_keep_candidate_order() -> None:
    eps = [make_endpoint(i, labels={ROLE_LABEL: "decode"}) for i in (3, 1, 2)]
    assert list(build(DecodeFilter).filter(CycleState(), make_request(), eps)) == eps


def _labelled() -> list[Any]:
    return [
        make_endpoint(0, labels={"tier": "a", "zone": "z1"}),
        make_endpoint(1, labels={"tier": "b"}),
        make_endpoint(2, labels={}),
    ]


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        ({}, [0, 1, 2]),
        ({"matchLabels": {"tier": "a"}}, [0]),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, [0, 1]),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, [1, 2]),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, [0]),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, [1, 2]),
        (
            {
                "matchLabels": {"tier": "a"},
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}],
            },
            [],
        ),
    ],
)
def test_label_selector(params: dict[str, Any], kept: list[int]) -> None:
    eps = _labelled()
    out = build(LabelSelectorFilter, **params).filter(CycleState(), make_request(), eps)
    assert [eps.index(e) for e in out] == kept


@pytest.mark.parametrize(
    "expr",
    [
        {"key": "k", "operator": "In"},
        {"key": "k", "operator": "Exists", "values": ["v"]},
        {"key": "k", "operator": "Gt", "values": ["1"]},
        {"key": "", "operator": "Exists"},
    ],
)
def test_bad_selector_is_rejected(expr: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        build(LabelSelectorFilter, matchExpressions=[expr])


def test_deprecated_by_label_and_by_label_selector_warn_and_work() -> None:
    with capture_logs() as logs:
        f = build(ByLabelFilter, label="tier", validValues=["b"], allowsNoLabel=True)
        s = build(ByLabelSelectorFilter, matchLabels={"tier": "a"})
    assert {e["type"] for e in logs if e["event"] == "deprecated_plugin_type"} == {
        "by-label",
        "by-label-selector",
    }
    eps = _labelled()
    assert [eps.index(e) for e in f.filter(CycleState(), make_request(), eps)] == [1, 2]
    assert [eps.index(e) for e in s.filter(CycleState(), make_request(), eps)] == [0]


@pytest.mark.parametrize("params", [{}, {"label": "tier"}])
def test_by_label_needs_a_label_and_values(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="by-label"):
        build(ByLabelFilter, **params)
