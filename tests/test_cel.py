"""epp.cel: compile-time checks, the usage variable, result conversion, and compiled closures == celpy.

The differential test at the end is the fence for our own CEL compiler: hypothesis writes
expressions over the variable the reporter exposes (``usage``), our closures evaluate them,
and celpy's own ``Environment``/``Runner`` (the reference it replaces) evaluates them too;
both must give the same value, or both an error.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.celparser import CELParseError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from epp.cel import CelCompileError, CelProgram, as_int64, is_true, usage_value

Counts = tuple[int, int, int, int | None]  # prompt, completion, total, cached (None: not reported)
USAGE: Counts = (7, 10, 17, None)
CACHED: Counts = (7, 10, 17, 3)


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
def test_evaluates_like_gie(source: str, usage: Counts, expected: Any) -> None:
    """Expressions from GIE's README and tests give their documented values on the fast path."""
    program = CelProgram(source)
    assert program.compiled
    result = program.evaluate(usage_value(*usage))
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
    result = CelProgram(source).evaluate(usage_value(*USAGE))
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
    assert program.evaluate(usage_value(*USAGE)) == 2


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
            (0, 0, 0, 0),
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
def test_usage_value_is_gies_struct(usage: Counts, expected: dict[str, Any]) -> None:
    """``usage`` has GIE's keys, double values, and details only when cached tokens are known."""
    value = usage_value(*usage)
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


# --- the compiled closures against celpy's interpreter ---------------------------------------

FIELDS = (
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "usage.total_tokens",
    "usage.prompt_token_details.cached_tokens",
    "usage.prompt_token_details",
    "usage.missing",
    "usage",
)
NUMBERS = ("0", "1", "2", "7", "(-3)", "0.0", "1.5", "2.0", "3u", "0u", "9223372036854775807", "1e308")
LITERALS = (*NUMBERS, "true", "false", "null", "'a'", "''", "b'x'", "[1, 2]", "{'k': 1}")


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
        st.sampled_from(
            (
                "true",
                "false",
                "'completion_tokens' in usage",
                "'x' in usage",
                "'cached_tokens' in usage.prompt_token_details",
            )
        ),
    ),
    lambda b: st.one_of(_binary(b, ("&&", "||")), b.map(lambda c: f"!({c})")),
    max_leaves=4,
)
# ... and anything goes: errors, absorbed errors (``true || error``), odd types.
anything = st.recursive(
    st.one_of(st.sampled_from(FIELDS), st.sampled_from(LITERALS), numbers, booleans),
    lambda c: st.one_of(
        _binary(c, ("+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "in")),
        st.tuples(c, c, c).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        c.map(lambda x: f"!({x})"),
        c.map(lambda x: f"-({x})"),
        st.tuples(
            st.sampled_from(("int", "double", "uint", "string", "dyn", "size", "bool", "bytes", "type")), c
        ).map(lambda t: f"{t[0]}({t[1]})"),
    ),
    max_leaves=6,
)
expressions = st.one_of(numbers, booleans, anything)
counts = st.integers(0, 10**6) | st.sampled_from((0, 1, 2**53, 2**63))
usages = st.tuples(counts, counts, counts, st.none() | counts)


@pytest.fixture(scope="module", autouse=True)
def _celpy_ready() -> None:
    """Build one program first: celpy's first Environment raises the recursion limit, which
    hypothesis reports when it happens inside a test."""
    CelProgram("0")


def celpy_reference(source: str, usage: celtypes.MapType) -> Any:
    """celpy alone, as its documentation shows: Environment → compile → program → evaluate."""
    env = celpy.Environment()
    program = env.program(env.compile(source))
    try:
        return program.evaluate({"usage": usage})
    except Exception as e:  # why: any celpy failure is an error outcome
        return e


def check_against_celpy(source: str, usage: Counts) -> None:
    try:
        ours = CelProgram(source)
    except CelCompileError:
        # Our compile-time checks are cel-go's, stricter than celpy's parser; a syntax error
        # must be one for celpy too.
        with contextlib.suppress(CELParseError):
            celpy.Environment().compile(source)
            assume(False)
        return
    # List and map literals are outside the subset (celpy's interpreter runs them); the rest is in.
    assert ours.compiled or "[" in source or "{" in source, f"outside the compiled subset: {source}"
    data = usage_value(*usage)
    assert outcome(ours.evaluate(data)) == outcome(celpy_reference(source, data)), source


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, usage=usages)
def test_compiled_matches_celpy(source: str, usage: Counts) -> None:
    """For any expression of the compiled subset, our closures and celpy give the same outcome."""
    check_against_celpy(source, usage)


@pytest.mark.fuzz
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, usage=usages)
def test_compiled_matches_celpy_long(source: str, usage: Counts) -> None:
    """The same, at length (``pytest -m fuzz``)."""
    check_against_celpy(source, usage)
