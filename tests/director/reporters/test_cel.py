"""The CEL helper: compile-time checks, the usage variable, result conversion, and fast path == celpy."""

from __future__ import annotations

import math
from typing import Any

import pytest
from celpy import celtypes
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from epp.director.reporters.cel import CelCompileError, CelProgram, as_int64, is_true, usage_value
from epp.request import Usage

USAGE = Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17)
CACHED = Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17, cached_tokens=3)


def outcome(result: Any) -> tuple[str, str]:
    """What a caller can observe of a result: error or (type, value)."""
    if isinstance(result, Exception):
        return ("error", "")
    return (type(result).__name__, repr(result))


@pytest.mark.parametrize(
    ("source", "usage", "expected"),
    [
        pytest.param("usage.completion_tokens", USAGE, 10.0, id="field-is-a-double"),
        pytest.param("has(usage.completion_tokens)", USAGE, True, id="has-present"),
        pytest.param("has(usage.prompt_token_details)", USAGE, False, id="has-details-absent"),
        pytest.param("has(usage.prompt_token_details.cached_tokens)", CACHED, True, id="has-nested"),
        pytest.param("usage.prompt_token_details.cached_tokens", CACHED, 3.0, id="nested-field"),
        pytest.param("usage.prompt_tokens + usage.completion_tokens", USAGE, 17.0, id="sum"),
        pytest.param(
            "(has(usage.prompt_tokens) ? usage.prompt_tokens : 0) + "
            "(has(usage.completion_tokens) ? usage.completion_tokens : 0)",
            USAGE,
            17.0,
            id="gie-readme-total",
        ),
        pytest.param("usage.completion_tokens * 2.5", USAGE, 25.0, id="double-arithmetic"),
        pytest.param("usage.completion_tokens > 5 && usage.total_tokens < 100", USAGE, True, id="and"),
        pytest.param("!(usage.completion_tokens > 5) || false", USAGE, False, id="not-or"),
        pytest.param("int(usage.completion_tokens) * 2", USAGE, 20, id="int-conversion"),
        pytest.param("'completion_tokens' in usage", USAGE, True, id="in-map"),
        pytest.param("-usage.completion_tokens", USAGE, -10.0, id="negation"),
        pytest.param("\n  usage.completion_tokens\n", USAGE, 10.0, id="yaml-block-whitespace"),
    ],
)
def test_evaluates_like_gie(source: str, usage: Usage, expected: Any) -> None:
    """Expressions from GIE's README and tests give their documented values on the fast path."""
    program = CelProgram(source)
    assert program.compiled
    result = program.evaluate(usage_value(usage))
    assert not isinstance(result, Exception)
    assert result == expected


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("usage.nope", id="missing-field"),
        pytest.param("usage.prompt_token_details.cached_tokens", id="missing-details"),
        pytest.param("usage.completion_tokens.x", id="select-on-number"),
        pytest.param("1 / 0", id="int-division-by-zero"),
        pytest.param("usage.completion_tokens % 2", id="double-modulo"),
        pytest.param("1 + 'a'", id="int-plus-string"),
        pytest.param("usage.completion_tokens ? 1 : 2", id="non-bool-condition"),
    ],
)
def test_evaluation_errors_are_values(source: str) -> None:
    """A failing expression returns an Exception instance instead of raising."""
    result = CelProgram(source).evaluate(usage_value(USAGE))
    assert isinstance(result, Exception)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param("usage.(", "syntax error at line 1, column 7", id="syntax"),
        pytest.param("", "syntax error", id="empty"),
        pytest.param("usgae.completion_tokens", "undeclared reference to 'usgae'", id="typo-variable"),
        pytest.param("cost(usage)", "undeclared reference to 'cost'", id="unknown-function"),
        pytest.param(
            "usage.completion_tokens.round()", "undeclared reference to 'round'", id="unknown-method"
        ),
        pytest.param("has(usage)", "invalid argument to has() macro", id="has-needs-field"),
        pytest.param("has(usage.a, usage.b)", "invalid argument to has() macro", id="has-one-argument"),
        pytest.param("Foo{a: 1}", "message construction", id="message"),
    ],
)
def test_compile_errors(source: str, message: str) -> None:
    """What cel-go rejects against a lone ``usage`` variable is rejected at compile time."""
    with pytest.raises(CelCompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CelProgram(source)


def test_macros_bind_their_variable() -> None:
    """A macro's loop variable is declared inside it; the expression runs on celpy's interpreter."""
    program = CelProgram("[1, 2, 3].filter(x, x > 1).size()")
    assert not program.compiled
    assert program.evaluate(usage_value(USAGE)) == 2


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param(
            USAGE, {"prompt_tokens": 7.0, "completion_tokens": 10.0, "total_tokens": 17.0}, id="no-details"
        ),
        pytest.param(
            CACHED,
            {
                "prompt_tokens": 7.0,
                "completion_tokens": 10.0,
                "total_tokens": 17.0,
                "prompt_token_details": {"cached_tokens": 3.0},
            },
            id="cached-tokens",
        ),
        pytest.param(
            Usage(cached_tokens=0),
            {
                "prompt_tokens": 0.0,
                "completion_tokens": 0.0,
                "total_tokens": 0.0,
                "prompt_token_details": {"cached_tokens": 0.0},
            },
            id="zero-cached-is-known",
        ),
    ],
)
def test_usage_value_is_gies_struct(usage: Usage, expected: dict[str, Any]) -> None:
    """``usage`` has GIE's keys, double values, and details only when cached tokens are known."""
    value = usage_value(usage)
    assert isinstance(value, celtypes.MapType)
    assert value == expected
    assert all(isinstance(v, celtypes.DoubleType) for k, v in value.items() if k != "prompt_token_details")


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(celtypes.DoubleType(10.0), 10, id="double"),
        pytest.param(celtypes.DoubleType(10.9), 10, id="double-truncates"),
        pytest.param(celtypes.DoubleType(-10.9), -10, id="negative-truncates-toward-zero"),
        pytest.param(25.0, 25, id="plain-float"),
        pytest.param(celtypes.IntType(7), 7, id="int"),
        pytest.param(celtypes.DoubleType(0.0), 0, id="zero"),
        pytest.param(celtypes.BoolType(True), None, id="bool"),
        pytest.param(celtypes.UintType(7), None, id="uint"),
        pytest.param(celtypes.StringType("10"), None, id="string"),
        pytest.param(math.nan, None, id="nan"),
        pytest.param(math.inf, None, id="inf"),
        pytest.param(2.0**63, None, id="out-of-int64"),
        pytest.param(ValueError("x"), None, id="error"),
    ],
)
def test_as_int64(result: object, expected: int | None) -> None:
    """Only ints and finite doubles in int64 range become a number, as Go's int64/float64 cases."""
    assert as_int64(result) == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(celtypes.BoolType(True), True, id="true"),
        pytest.param(celtypes.BoolType(False), False, id="false"),
        pytest.param(celtypes.IntType(1), False, id="int-is-not-bool"),
        pytest.param(ValueError("x"), False, id="error"),
    ],
)
def test_is_true(result: object, expected: bool) -> None:
    """A condition passes only on CEL ``true``."""
    assert is_true(result) is expected


# --- the fast path against celpy's interpreter -------------------------------------------

FIELDS = (
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "usage.total_tokens",
    "usage.prompt_token_details.cached_tokens",
    "usage.prompt_token_details",
    "usage.missing",
    "usage",
)
NUMBERS = ("0", "1", "2", "7", "(-3)", "0.0", "1.5", "2.0", "3u")
LITERALS = (*NUMBERS, "true", "false", "null", "'a'")


def _binary(children: st.SearchStrategy[str], ops: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.tuples(children, st.sampled_from(ops), children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")


# Well-typed expressions reach values (and the arithmetic between doubles and ints) ...
numbers = st.recursive(
    st.one_of(st.sampled_from(FIELDS[:3]), st.sampled_from(FIELDS[:4]), st.sampled_from(NUMBERS)),
    lambda n: st.one_of(
        _binary(n, ("+", "-", "*", "/")),
        n.map(lambda c: f"-({c})"),
        st.tuples(st.sampled_from(("int", "double", "dyn")), n).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(n, n, n).map(lambda t: f"({t[0]} > {t[1]} ? {t[2]} : {t[0]})"),
    ),
    max_leaves=6,
)
booleans = st.recursive(
    st.one_of(
        _binary(numbers, ("<", "<=", ">", ">=", "==", "!=")),
        st.sampled_from(FIELDS[:6]).map(lambda f: f"has({f})"),
        st.sampled_from(("true", "false", "'completion_tokens' in usage", "'x' in usage")),
    ),
    lambda b: st.one_of(_binary(b, ("&&", "||")), b.map(lambda c: f"!({c})")),
    max_leaves=4,
)
# ... and anything goes: errors, absorbed errors (``true || error``), odd types.
anything = st.recursive(
    st.one_of(st.sampled_from(FIELDS), st.sampled_from(LITERALS), numbers, booleans),
    lambda c: st.one_of(
        _binary(c, ("+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||")),
        st.tuples(c, c, c).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        c.map(lambda x: f"!({x})"),
        c.map(lambda x: f"-({x})"),
        st.tuples(st.sampled_from(("int", "double", "uint", "string", "dyn")), c).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
    ),
    max_leaves=6,
)
expressions = st.one_of(numbers, booleans, anything)
usages = st.builds(
    Usage,
    prompt_tokens=st.integers(0, 10**6),
    completion_tokens=st.integers(0, 10**6),
    total_tokens=st.integers(0, 2 * 10**6),
    cached_tokens=st.none() | st.integers(0, 10**6),
)


@pytest.fixture(scope="module", autouse=True)
def _celpy_ready() -> None:
    """Build one program first: celpy's first Environment raises the recursion limit, which
    hypothesis reports when it happens inside a test."""
    CelProgram("0")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, usage=usages)
def test_fast_path_matches_celpy(source: str, usage: Usage) -> None:
    """For any expression of the compiled subset, the closures and celpy give the same outcome."""
    try:
        fast = CelProgram(source)
    except CelCompileError:
        assume(False)
        return
    assert fast.compiled, source
    reference = CelProgram(source, fast=False)
    assert not reference.compiled
    data = usage_value(usage)
    assert outcome(fast.evaluate(data)) == outcome(reference.evaluate(data)), source
