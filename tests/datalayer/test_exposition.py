"""The Prometheus text parser: tricky inputs, bounds, and agreement with prometheus_client."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.exposition import ExpositionError, ExpositionParser, MetricFamilies, with_total_aliases
from tests.datalayer.conftest import VLLM_FULL, VLLM_SMALL


def samples(fams: MetricFamilies, name: str) -> list[tuple[dict[str, str], float, int | None]]:
    return [(dict(s.labels), s.value, s.timestamp_ms) for s in fams.get(name, [])]


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        pytest.param(b"a 1\n", "a", [({}, 1.0, None)], id="bare-first-line"),
        pytest.param(b"a{} 2", "a", [({}, 2.0, None)], id="empty-labels-no-newline"),
        pytest.param(
            b'# HELP a x\n# TYPE a gauge\na{x="1"} 3\n', "a", [({"x": "1"}, 3.0, None)], id="help-type"
        ),
        pytest.param(b'a{x="1",} 3\n', "a", [({"x": "1"}, 3.0, None)], id="trailing-comma"),
        pytest.param(b'a { x = "1" , y="2" } 3\n', "a", [({"x": "1", "y": "2"}, 3.0, None)], id="blanks"),
        pytest.param(b"  \ta 4\n", "a", [({}, 4.0, None)], id="leading-blanks"),
        pytest.param(b"a 5\r\n", "a", [({}, 5.0, None)], id="crlf"),
        pytest.param(b"a 6 1700000000000\n", "a", [({}, 6.0, 1700000000000)], id="timestamp"),
        pytest.param(b"a 6 -5\n", "a", [({}, 6.0, -5)], id="negative-timestamp"),
        pytest.param(b"a 1e3\n", "a", [({}, 1000.0, None)], id="exponent"),
        pytest.param(b"a -Inf\n", "a", [({}, -math.inf, None)], id="minus-inf"),
        pytest.param(b"a +Inf\n", "a", [({}, math.inf, None)], id="plus-inf"),
        pytest.param(
            b'a{v="q\\"uote \\\\ back \\n nl"} 1\n',
            "a",
            [({"v": 'q"uote \\ back \n nl'}, 1.0, None)],
            id="escapes",
        ),
        pytest.param(b'a{v="}{, ="} 1\n', "a", [({"v": "}{, ="}, 1.0, None)], id="braces-in-value"),
        pytest.param(b'a{v="\xc3\xa9t\xc3\xa9"} 1\n', "a", [({"v": "\u00e9t\u00e9"}, 1.0, None)], id="utf8"),
        pytest.param(b"a 1\na 2\n", "a", [({}, 1.0, None), ({}, 2.0, None)], id="duplicate-series-kept"),
        pytest.param(b"ab 1\na_b 2\nab_c 3\n", "ab", [({}, 1.0, None)], id="no-prefix-confusion"),
        pytest.param(b'x{l="a 9"} 1\n#a 2\n', "a", [], id="name-inside-value-or-comment"),
        pytest.param(
            b"garbage !!\n\x00\xff\nnot a metric\na 7\n", "a", [({}, 7.0, None)], id="garbage-skipped"
        ),
        pytest.param(b"a_total 8\n", "a_total", [({}, 8.0, None)], id="counter-total"),
    ],
)
def test_parse_wanted(text: bytes, name: str, expected: list[Any]) -> None:
    """Wanted lines parse to the right labels/value/timestamp; everything else is skipped."""
    fams = ExpositionParser(with_total_aliases([name])).parse(text)
    assert samples(fams, name) == expected


def test_nan_value() -> None:
    """NaN is a valid exposition value (the extractor decides what it means)."""
    (s,) = ExpositionParser(["a"]).parse(b"a NaN\n")["a"]
    assert math.isnan(s.value)


def test_family_total_alias() -> None:
    """A counter exposed as ``x_total`` answers for ``x``; an exact name wins over the alias."""
    fams = ExpositionParser(with_total_aliases(["x", "y"])).parse(b"x_total 1\ny 2\ny_total 3\n")
    assert [s.value for s in fams.family("x") or []] == [1.0]
    assert [s.value for s in fams.family("y") or []] == [2.0]
    assert fams.family("z") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(b"a \n", "line 1: malformed sample line", id="missing-value"),
        pytest.param(b"b 1\na x\n", "line 2: invalid value", id="bad-value"),
        pytest.param(b"a 1_000\n", "invalid value", id="underscore-value"),
        pytest.param(b"a 1 1.5\n", "invalid timestamp", id="float-timestamp"),
        pytest.param(b"a 1 2 3\n", "malformed sample line", id="extra-token"),
        pytest.param(b'a{x="1" 1\n', "unterminated label set", id="unterminated-labels"),
        pytest.param(b'a{x="1"y="2"} 1\n', "malformed label set", id="missing-comma"),
        pytest.param(b"a{x=1} 1\n", "malformed label set", id="unquoted-value"),
        pytest.param(b'a{1x="1"} 1\n', "malformed label set", id="bad-label-name"),
        pytest.param(b'a{x="1",x="2"} 1\n', "duplicate label 'x'", id="duplicate-label"),
        pytest.param(b'a{x="\\q"} 1\n', "invalid escape sequence", id="bad-escape"),
        pytest.param(b'a{x="\xff"} 1\n', "not valid UTF-8", id="bad-utf8"),
        pytest.param(b'a{x="' + b"v" * 70_000 + b'"} 1\n', "value longer than", id="huge-label-value"),
    ],
)
def test_parse_errors(text: bytes, message: str) -> None:
    """A malformed wanted line is an error that names the line and the problem."""
    with pytest.raises(ExpositionError, match=message):
        ExpositionParser(["a", "b"]).parse(text)


def test_bounds() -> None:
    """Body and line sizes are bounded with clear errors."""
    with pytest.raises(ExpositionError, match="more than the limit of 10"):
        ExpositionParser(["a"], max_bytes=10).parse(b"a 1\n" * 3)
    with pytest.raises(ExpositionError, match="line longer than 16 bytes"):
        ExpositionParser(["a"], max_line=16).parse(b'a{x="' + b"y" * 20 + b'"} 1\n')
    # A huge value on a line nobody asked for costs nothing and is not an error.
    fams = ExpositionParser(["a"], max_label_value=8).parse(b'b{x="' + b"y" * 100_000 + b'"} 1\na 2\n')
    assert samples(fams, "a") == [({}, 2.0, None)]


def test_unwanted_garbage_is_an_error_only_when_parsing_everything() -> None:
    """Without a wanted set every sample line is parsed, so garbage fails like GIE's parser."""
    assert ExpositionParser(["a"]).parse(b"zz top\na 1\n")["a"][0].value == 1.0
    with pytest.raises(ExpositionError, match="line 1"):
        ExpositionParser(None).parse(b"zz top\na 1\n")


def test_labels_are_read_only_and_lines_cached() -> None:
    """Repeated lines come back as the same sample (parsed once); its labels cannot be changed."""
    parser = ExpositionParser(["a"])
    first = parser.parse(b'# one page\na{x="1"} 1\n')["a"][0]
    again = parser.parse(b'# other page\na{x="1"} 1\n')["a"][0]
    assert again is first
    with pytest.raises(TypeError):
        first.labels["x"] = "2"  # type: ignore[index]


def test_invalid_wanted_name() -> None:
    """Asking for a name that cannot exist is a programming error."""
    with pytest.raises(ValueError, match="invalid metric name"):
        ExpositionParser(["no spaces"])


def _client_samples(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    return {
        (s.name, frozenset(s.labels.items()), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


@pytest.mark.parametrize("page", [pytest.param(VLLM_SMALL, id="small"), pytest.param(VLLM_FULL, id="full")])
def test_agrees_with_prometheus_client(page: bytes) -> None:
    """On a realistic vLLM page every sample matches prometheus_client's parser, and wanted ⊆ all."""
    everything = ExpositionParser(None).parse(page)
    ours = {(name, frozenset(s.labels.items()), s.value) for name, ss in everything.items() for s in ss}
    assert ours == _client_samples(page.decode())
    wanted = with_total_aliases(
        ["vllm:num_requests_waiting", "vllm:lora_requests_info", "vllm:prompt_tokens"]
    )
    subset = ExpositionParser(wanted).parse(page)
    assert set(subset) == {"vllm:num_requests_waiting", "vllm:lora_requests_info", "vllm:prompt_tokens_total"}
    for name, ss in subset.items():
        assert ss == everything[name]


_label_value = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r"), max_size=40
)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(_label_value, min_size=1, max_size=4), value=st.floats(allow_nan=False))
def test_label_values_round_trip(values: list[str], value: float) -> None:
    """Any label value, escaped as exposition requires, parses back to itself."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = ",".join(f'l{i}="{esc(v)}"' for i, v in enumerate(values))
    line = f"m{{{labels}}} {value!r}\n".encode()
    (s,) = ExpositionParser(["m"]).parse(line)["m"]
    assert dict(s.labels) == {f"l{i}": v for i, v in enumerate(values)}
    assert s.value == value


# --- differential: generated exposition text against prometheus_client, all and filtered ------------
_NAMES = ("a", "ab", "a_b", "a_total", "ab_total", "vllm:x", "vllm:xy", "vllm:x_total", "vllm:x_bucket", "_u")
_LABEL_NAMES = ("l", "le", "model_name", "k2", "_p")
_values = st.one_of(
    st.integers(-(10**6), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "-0", "0.5e-3", "1E+2"]),
)
_lv = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r"), max_size=12)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _pages(draw: st.DrawFn) -> str:
    lines: list[str] = []
    names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=6, unique=True))
    for name in names:  # one family per name, its samples together (as every client writes them)
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(st.sampled_from(['help', 'a b {c} d', '']))}".rstrip())
        if draw(st.booleans()):
            # prometheus_client renames the samples of a counter not named *_total (ours keeps
            # names as exposed and aliases on lookup), so counters here are *_total as vLLM's are.
            kinds = ["gauge", "untyped"] + (["counter"] if name.endswith("_total") else [])
            lines.append(f"# TYPE {name} {draw(st.sampled_from(kinds))}")
        for _ in range(draw(st.integers(1, 4))):
            keys = draw(st.lists(st.sampled_from(_LABEL_NAMES), max_size=3, unique=True))
            labels = ",".join(f'{k}="{_esc(draw(_lv))}"' for k in keys)
            block = f"{{{labels}}}" if len(keys) > 0 or draw(st.booleans()) else ""
            ts = f" {draw(st.integers(0, 2**41))}" if draw(st.integers(0, 3)) == 0 else ""
            lines.append(f"{name}{block} {draw(_values)}{ts}")
        if draw(st.integers(0, 3)) == 0:
            lines.append("# a free comment")
    return "\n".join(lines) + draw(st.sampled_from(["\n", ""]))


def _key(name: str, labels: Any, value: float, ts: float | None) -> tuple[Any, ...]:
    return (name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else value, ts)


@settings(max_examples=300, deadline=None)
@given(page=_pages(), data=st.data())
def test_generated_pages_agree_with_prometheus_client(page: str, data: st.DataObject) -> None:
    """Every sample of a generated page parses as prometheus_client parses it, in page order; the
    filtered parser (wanted names only, the scrape path) returns exactly those samples of the
    wanted families, identical to the unfiltered parse, and nothing else."""
    client = [
        _key(s.name, s.labels, s.value, None if s.timestamp is None else float(s.timestamp))
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
    ]
    everything = ExpositionParser(None).parse(page.encode())
    ours = [
        _key(name, s.labels, s.value, None if s.timestamp_ms is None else s.timestamp_ms / 1000)
        for name, ss in everything.items()
        for s in ss
    ]
    assert ours == client

    wanted = data.draw(st.lists(st.sampled_from(_NAMES), max_size=4, unique=True))
    filtered = ExpositionParser(with_total_aliases(wanted)).parse(page.encode())

    def keyed(fams: MetricFamilies) -> dict[str, list[tuple[Any, ...]]]:
        return {n: [_key(n, s.labels, s.value, s.timestamp_ms) for s in ss] for n, ss in fams.items()}

    expect = {n: ss for n, ss in keyed(everything).items() if n in with_total_aliases(wanted)}
    assert keyed(filtered) == expect
