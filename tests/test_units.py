"""epp.units: Go's duration and strconv syntax, checked on hypothesis input against its documented properties.

No Python implementation of Go's ``time.ParseDuration``/``Duration.String`` or of pflag's
``strconv`` parsers exists to compare with, so these are property tests: the grammar
from Go's documentation (as a regex), exact decimal arithmetic (``fractions.Fraction``) for
values, the format → parse round trip over all of int64, and Python's ``int`` wherever
its literal grammar and Go's coincide.
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from epp.units import (
    format_go_duration,
    format_go_duration_ns,
    go_quote,
    parse_go_atoi,
    parse_go_bool,
    parse_go_duration,
    parse_go_duration_ns,
    parse_go_int,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UNITS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "μs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
# time.ParseDuration's doc: "[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+" with the units above, and "0".
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = "|".join(sorted(map(re.escape, UNITS), key=len, reverse=True))
GRAMMAR = re.compile(rf"[-+]?(?:0|(?:{_NUMBER}(?:{_UNIT}))+)")
COMPONENT = re.compile(rf"({_NUMBER})({_UNIT})")
# Duration.String's output: "0s", "<n>[.<frac>](ns|µs|ms)" under a second, else [<h>h][<m>m]<s>[.<frac>]s.
CANONICAL = re.compile(
    r"0s|-?(?:[1-9][0-9]{0,2}(?:\.[0-9]*[1-9])?(?:µs|ms)|[1-9][0-9]{0,2}ns"
    r"|(?:[1-9][0-9]*h(?:[0-9]|[1-5][0-9])m|(?:[1-9]|[1-5][0-9])m)?(?:[0-9]|[1-5][0-9])(?:\.[0-9]*[1-9])?s)"
)

int64s = st.integers(INT64_MIN, INT64_MAX)
digits = st.text("0123456789", max_size=6)
components = st.tuples(digits, st.none() | digits, st.sampled_from(sorted(UNITS))).map(
    lambda t: f"{t[0]}{'' if t[1] is None else '.' + t[1]}{t[2]}"
)
grammar_like = st.tuples(st.sampled_from(("", "+", "-")), st.lists(components, min_size=1, max_size=4)).map(
    lambda t: t[0] + "".join(t[1])
)
# Near-misses: the grammar's own characters in any order, plus a few that are never valid.
near_misses = st.text("0123456789.+-nsuµμmhx ", max_size=10)


def exact_ns(text: str) -> Fraction:
    """The exact value of a grammatical duration, in nanoseconds."""
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body == "0":
        return Fraction(0)
    total = Fraction(0)
    for number, unit in COMPONENT.findall(body):
        whole, _, frac = number.partition(".")
        value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
        total += value * UNITS[unit]
    return sign * total


def check_duration_grammar(text: str) -> None:
    """Accepted exactly when the grammar matches and the value fits int64; the value is exact
    to within Go's float64 truncation of each fraction (at most 1 ns per component)."""
    valid = GRAMMAR.fullmatch(text) is not None
    if not valid:
        with pytest.raises(ValueError, match=r"^time: "):
            parse_go_duration_ns(text)
        return
    exact = exact_ns(text)
    if not INT64_MIN - 2**20 <= exact <= INT64_MAX + 2**20:
        with pytest.raises(ValueError, match=r"^time: invalid duration"):
            parse_go_duration_ns(text)
        return
    try:
        ns = parse_go_duration_ns(text)
    except ValueError:
        assert abs(exact) > INT64_MAX - 2**20, text  # only near the edge may truncation decide
        return
    slack = len(COMPONENT.findall(text))
    assert abs(ns - exact) <= slack, (text, ns, exact)
    assert ns == 0 or (ns < 0) == text.startswith("-")
    assert parse_go_duration(text) == ns / 1e9


@settings(max_examples=300, deadline=None)
@given(text=grammar_like | near_misses)
@example(text="1.5h")
@example(text="-9223372036854775808ns")
@example(text="9223372036854775808ns")
@example(text="0.000000000000000000001h")
@example(text="1.99999999999999999999999s")
def test_duration_grammar_and_values(text: str) -> None:
    check_duration_grammar(text)


@pytest.mark.fuzz
@settings(max_examples=20000, deadline=None)
@given(text=grammar_like | near_misses)
def test_duration_grammar_and_values_long(text: str) -> None:
    """The same, at length (``pytest -m fuzz``)."""
    check_duration_grammar(text)


@settings(max_examples=300, deadline=None)
@given(ns=int64s | st.sampled_from((INT64_MIN, INT64_MAX, 0, 999, 1000, 999_999_999, 10**9, 3600 * 10**9)))
def test_format_then_parse_is_identity_on_int64(ns: int) -> None:
    """Every int64 duration is written canonically and read back to the same nanosecond."""
    text = format_go_duration_ns(ns)
    assert CANONICAL.fullmatch(text), text
    assert parse_go_duration_ns(text) == ns


@settings(max_examples=200, deadline=None)
@given(text=grammar_like)
def test_parse_then_format_is_canonical(text: str) -> None:
    """Parsing any accepted text and writing it again gives a fixed point of format ∘ parse."""
    try:
        ns = parse_go_duration_ns(text)
    except ValueError:
        return
    canonical = format_go_duration_ns(ns)
    assert format_go_duration_ns(parse_go_duration_ns(canonical)) == canonical


@settings(max_examples=200, deadline=None)
@given(ns=st.integers(-(2**50), 2**50))
def test_float_seconds_wrappers_agree(ns: int) -> None:
    """The float-seconds API is the ns API divided by 1e9 (exact below 2**53 ns)."""
    assert format_go_duration(ns / 1e9) == format_go_duration_ns(ns)
    assert parse_go_duration(format_go_duration_ns(ns)) == ns / 1e9


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        pytest.param(0, "0s", id="zero"),
        pytest.param(1, "1ns", id="ns"),
        pytest.param(1_500, "1.5µs", id="micro-sign"),
        pytest.param(50_000_000, "50ms", id="ms"),
        pytest.param(90 * 10**9, "1m30s", id="minutes"),
        pytest.param(3600 * 10**9, "1h0m0s", id="hour-keeps-zero-minutes"),
        pytest.param(7_200_500_000_000, "2h0m0.5s", id="fraction-of-second"),
        pytest.param(-(10**9), "-1s", id="negative"),
        pytest.param(INT64_MIN, "-2562047h47m16.854775808s", id="min-int64"),
    ],
)
def test_format_examples_from_go(ns: int, text: str) -> None:
    """Go's documented and tested outputs of Duration.String."""
    assert format_go_duration_ns(ns) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("1", 'time: missing unit in duration "1"', id="missing-unit"),
        pytest.param("1x", 'time: unknown unit "x" in duration "1x"', id="unknown-unit"),
        pytest.param(
            "1µ", 'time: unknown unit "\\xc2\\xb5" in duration "1\\xc2\\xb5"', id="time-quote-bytes"
        ),
        pytest.param("", 'time: invalid duration ""', id="empty"),
        pytest.param("-.s", 'time: invalid duration "-.s"', id="no-digits"),
        pytest.param(
            "9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"', id="overflow"
        ),
    ],
)
def test_duration_error_texts(text: str, message: str) -> None:
    """Go's messages, with the time package's own quoting (bytes outside ASCII as \\xNN)."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_go_duration_ns(text)


# --- strconv -------------------------------------------------------------------------------------

int_texts = st.text("0123456789abcdefxXoObB_+-", max_size=8)


def _legacy_octal(text: str) -> bool:
    body = text.lstrip("+-")
    return len(body) > 1 and body[0] == "0" and body[1] in "01234567_"


@settings(max_examples=400, deadline=None)
@given(text=int_texts)
@example(text="0x_1f")
@example(text="1_000")
@example(text="0_7")
@example(text="-9223372036854775808")
@example(text="9223372036854775808")
def test_parse_int_agrees_with_python_where_grammars_overlap(text: str) -> None:
    """``ParseInt(s, 0, 64)`` and Python's ``int(s, 0)`` share prefixes, signs and ``_`` rules;
    Go alone reads a leading 0 as octal, and only Go limits the range to int64."""
    try:
        theirs: int | None = int(text, 0)
    except ValueError:
        theirs = None
    try:
        ours: int | None = parse_go_int(text)
    except ValueError as e:
        message = str(e)
        ours = None
    else:
        message = ""
    assert ours is not None or message.startswith(f"strconv.ParseInt: parsing {go_quote(text)}: ")
    if theirs is not None and INT64_MIN <= theirs <= INT64_MAX:
        assert ours == theirs
    elif theirs is not None:
        assert ours is None
    elif ours is not None:
        assert _legacy_octal(text), text
        assert ours == int(text.replace("_", ""), 8)


@settings(max_examples=200, deadline=None)
@given(n=int64s, base=st.sampled_from(("x", "X", "o", "O", "b", "B", "", "octal")))
def test_parse_int_round_trips_every_base(n: int, base: str) -> None:
    """Any int64 written in any of Go's literal forms reads back."""
    sign, m = ("-", -n) if n < 0 else ("", n)
    body = {"": str(m), "octal": "0" + format(m, "o")}.get(base) or f"0{base}{format(m, base.lower())}"
    assert parse_go_int(sign + body) == n


@settings(max_examples=300, deadline=None)
@given(text=st.text("0123456789+-_ ", max_size=8) | int64s.map(str))
def test_atoi_is_python_int_without_underscores_or_spaces(text: str) -> None:
    """``Atoi`` is base 10 with an optional sign: Python's ``int`` minus ``_``, spaces and the int64 limit."""
    try:
        ours: int | None = parse_go_atoi(text)
    except ValueError:
        ours = None
    try:
        theirs: int | None = int(text)
    except ValueError:
        theirs = None
    if "_" in text or " " in text:
        assert ours is None
    elif theirs is not None and INT64_MIN <= theirs <= INT64_MAX:
        assert ours == theirs
    else:
        assert ours is None


@pytest.mark.parametrize(
    "text", ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"]
)
def test_parse_bool_accepts_go_spellings(text: str) -> None:
    assert parse_go_bool(text) is (text[0] in "1tT")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=6))
def test_parse_bool_rejects_everything_else(text: str) -> None:
    if text in {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}:
        return
    with pytest.raises(ValueError, match=r"^strconv\.ParseBool: parsing "):
        parse_go_bool(text)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_go_quote_is_a_go_string_literal(text: str) -> None:
    """``%q`` output: one line, printable, and it decodes back to the input (Go literals are
    a superset of what Python's ``unicode_escape`` reads for these escapes)."""
    quoted = go_quote(text)
    assert quoted[0] == quoted[-1] == '"'
    assert quoted.isprintable()
    body = quoted[1:-1]
    assert not re.search(r'(?<!\\)(?:\\\\)*"', body)
    decoded = body.encode("ascii", "backslashreplace").decode("unicode_escape")
    assert decoded == text


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        pytest.param("abc", '"abc"', id="plain"),
        pytest.param('a"b\\c', '"a\\"b\\\\c"', id="quote-backslash"),
        pytest.param("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"', id="c-escapes"),
        pytest.param("\x00\x7f", '"\\x00\\x7f"', id="hex"),
        pytest.param("\u00a0é", '"\\u00a0é"', id="nbsp-not-printable"),
    ],
)
def test_go_quote_examples(text: str, quoted: str) -> None:
    """strconv.Quote's outputs for the escapes Go documents."""
    assert go_quote(text) == quoted
