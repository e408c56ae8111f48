"""Label selectors against Kubernetes' ``labels.Parse`` semantics (no Python reference exists).

The cases are Kubernetes' documented grammar; the property test renders random requirements
as selector text and checks that the parsed selector matches a label set exactly when every
requirement, evaluated directly, holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.labels import parse_label_selector


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b,c", {"a": "b"}, False),  # c must exist
        ("a!=b", {}, True),  # != matches a missing label, as Kubernetes'
        ("!a", {"a": "x"}, False),
        ("a in (x, y),b notin (z)", {"a": "y", "b": "w"}, True),
        ("a in (x,y)", {"a": "z"}, False),
        ("disaggregatedset.x-k8s.io/name=my-set", {"disaggregatedset.x-k8s.io/name": "my-set"}, True),
        ("", {"anything": "x"}, True),  # the empty selector matches everything
    ],
)
def test_grammar(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(selector).matches(labels) is matches


@pytest.mark.parametrize("bad", ["not a valid selector!!", "a=b,", "a in (x", "=b", "a=b=c", "a in (x!)"])
def test_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_label_selector(bad)


KEYS = st.sampled_from(["a", "b", "x.io/c"])
VALUES = st.sampled_from(["v1", "v2", "v-3"])
REQUIREMENT = st.one_of(
    st.tuples(st.sampled_from(["=", "==", "!="]), KEYS, VALUES.map(lambda v: (v,))),
    st.tuples(st.sampled_from(["in", "notin"]), KEYS, st.lists(VALUES, min_size=1, max_size=3).map(tuple)),
    st.tuples(st.sampled_from(["exists", "!"]), KEYS, st.just(())),
)


def _render(op: str, key: str, values: tuple[str, ...]) -> str:
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    if op in ("in", "notin"):
        return f"{key} {op} ({', '.join(values)})"
    return f"{key}{op}{values[0]}"


def _holds(op: str, key: str, values: tuple[str, ...], labels: dict[str, str]) -> bool:
    if op == "exists":
        return key in labels
    if op == "!":
        return key not in labels
    if op in ("=", "==", "in"):
        return key in labels and labels[key] in values
    return key not in labels or labels[key] not in values


@given(
    st.lists(REQUIREMENT, max_size=4),
    st.dictionaries(KEYS, VALUES, max_size=3),
    st.sampled_from([",", ", ", " ,"]),
)
def test_parsed_selector_matches_exactly_when_every_requirement_holds(
    requirements: list[tuple[str, str, tuple[str, ...]]], labels: dict[str, str], sep: str
) -> None:
    text = sep.join(_render(*r) for r in requirements)
    expected = all(_holds(*r, labels) for r in requirements)
    assert parse_label_selector(text).matches(labels) is expected
