"""Metric specs: PromQL-style parsing, series selection and the built-in engine tables."""

from __future__ import annotations

import pytest

from epp.datalayer.engines import (
    BUILTIN_ENGINES,
    EngineMapping,
    ExtractionError,
    Spec,
    SpecError,
    atoi,
    go_map,
    parse_spec,
)
from epp.datalayer.exposition import ExpositionParser, MetricFamilies


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", None, id="empty-disables"),
        pytest.param("vllm:num_requests_waiting", Spec("vllm:num_requests_waiting"), id="bare-name"),
        pytest.param("m{a=b}", Spec("m", (("a", "b"),)), id="unquoted-value-auto-quoted"),
        pytest.param("m{a=\"b c\", d='e'}", Spec("m", (("a", "b c"), ("d", "e"))), id="quotes"),
        pytest.param("m{a=`x\\y`}", Spec("m", (("a", "x\\y"),)), id="backtick-raw"),
        pytest.param('m{a="q\\"t"}', Spec("m", (("a", 'q"t'),)), id="escaped-quote"),
        pytest.param(" m { a = b , } ", Spec("m", (("a", "b"),)), id="blanks-trailing-comma"),
        pytest.param("m{a!=b,c=~d.*,e!~f,g=h}", Spec("m", (("g", "h"),)), id="only-equality-kept"),
        pytest.param('m{__name__="m",a="1"}', Spec("m", (("a", "1"),)), id="pseudo-labels-dropped"),
        pytest.param("m{}", Spec("m"), id="empty-braces"),
        pytest.param("m{a=1,a=2}", Spec("m", (("a", "2"),)), id="last-duplicate-wins"),
    ],
)
def test_parse_spec(text: str, expected: Spec | None) -> None:
    """Specs accept PromQL instant-selector syntax and keep only equality matchers."""
    assert parse_spec(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{a=b}", "empty metric name in specification", id="no-name"),
        pytest.param("m{a=b,", "missing '}'", id="unclosed"),
        pytest.param("m[5m]", "not a valid metric specification", id="range-selector"),
        pytest.param("m{a}", "expected a label matcher", id="no-operator"),
        pytest.param('m{a="\\q"}', "unknown escape sequence", id="bad-escape"),
        pytest.param("m{a=b c=d}", "expected ',' or '}'", id="missing-comma"),
        pytest.param("9m", "expected a metric name", id="bad-name"),
    ],
)
def test_parse_spec_errors(text: str, message: str) -> None:
    """Invalid specs are rejected with a message naming the spec."""
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def fams(text: bytes, *names: str) -> MetricFamilies:
    return ExpositionParser(names).parse(text)


@pytest.mark.parametrize(
    ("spec", "text", "value"),
    [
        pytest.param(Spec("m"), b"m 1\n", 1.0, id="single"),
        pytest.param(Spec("m"), b"m 1 100\nm 2 300\nm 3 200\n", 2.0, id="latest-timestamp"),
        pytest.param(Spec("m"), b"m 1\nm 2\n", 1.0, id="tie-first"),
        pytest.param(Spec("m", (("t", "b"),)), b'm{t="a"} 1\nm{t="b",x="y"} 2\n', 2.0, id="label-subset"),
        pytest.param(Spec("m"), b"m_total 5\n", 5.0, id="total-alias"),
    ],
)
def test_latest(spec: Spec, text: bytes, value: float) -> None:
    """Among series whose labels contain the spec's, the latest timestamp wins (ties: first)."""
    assert spec.latest(fams(text, "m", "m_total")).value == value


def test_latest_errors() -> None:
    """No family, or no matching series, gives GIE's error texts."""
    with pytest.raises(ExtractionError, match="metric family 'm' not found"):
        Spec("m").latest(fams(b"other 1\n", "m"))
    with pytest.raises(ExtractionError, match=r"no matching metric found for 'm' with labels map\[t:x\]"):
        Spec("m", (("t", "x"),)).latest(fams(b'm{t="y"} 1\n', "m"))
    with pytest.raises(ExtractionError, match="no matching metric found"):
        Spec("m").latest(fams(b"m 1 -5\n", "m"))  # negative timestamps never beat the -1 start


def test_largest_value() -> None:
    """LoRA info picks the series with the largest value (its creation time)."""
    f = fams(b'm{r="a"} 10\nm{r="b"} 30\nm{r="c"} 20\n', "m")
    assert Spec("m").largest_value(f).labels["r"] == "b"
    with pytest.raises(ExtractionError, match="no matching lora metric found"):
        Spec("m", (("r", "z"),)).largest_value(f)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("42", 42, id="digits"),
        pytest.param("-7", -7, id="sign"),
        pytest.param("+3", 3, id="plus"),
    ],
)
def test_atoi(text: str, value: int) -> None:
    """Integers parse as Go's Atoi does."""
    assert atoi(text) == value


@pytest.mark.parametrize("text", ["1.0", " 1", "1_0", "", "\u0661"])
def test_atoi_rejects(text: str) -> None:
    """What Go's Atoi rejects is an error with its message."""
    with pytest.raises(ExtractionError, match=f'strconv.Atoi: parsing "{text}": invalid syntax'):
        atoi(text)


def test_builtin_tables_parse() -> None:
    """Every built-in engine table parses, with the §6.5 names and label overrides."""
    mappings = {t.name: EngineMapping.from_table(t) for t in BUILTIN_ENGINES}
    assert set(mappings) == {"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"}
    assert mappings["sglang"].cache_block_size_label == "page_size"
    assert mappings["sglang"].cache_num_blocks_label == "num_pages"
    assert mappings["vllm"].cache_block_size_label == "block_size"
    assert mappings["triton-tensorrt-llm"].queued == Spec(
        "nv_trt_llm_request_metrics", (("request_type", "waiting"),)
    )
    assert mappings["sglang"].lora is None


def test_go_map() -> None:
    """Labels print like Go's %v of a map (sorted keys)."""
    assert go_map({"b": "2", "a": "1"}) == "map[a:1 b:2]"
