"""epp.pflag: pflag's command-line syntax, as properties on hypothesis-generated flag sets and command lines.

No Python implementation of Go's pflag exists to compare with (argparse's grammar is a
different one), so these check what pflag documents: every spelling of a flag means the
same, values are taken verbatim (``=``, spaces, a leading ``-``), a bool flag takes its
value inline only, ``--`` ends the flags, and errors are pflag's.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp import pflag

names = st.text("abcdefgh-", min_size=2, max_size=6).filter(lambda n: n[0] != "-" and n not in ("help",))
values = st.text(max_size=6)


@st.composite
def flag_sets(draw: st.DrawFn) -> tuple[dict[str, bool], dict[str, str]]:
    """Flag names with their bool-ness, and shorthands for some non-bool ones."""
    is_bool = draw(st.dictionaries(names, st.booleans(), min_size=1, max_size=5))
    shorthands: dict[str, str] = {}
    for letter, name in zip("xyz", sorted(n for n, b in is_bool.items() if not b), strict=False):
        if draw(st.booleans()):
            shorthands[letter] = name
    return is_bool, shorthands


def spellings(name: str, value: str, is_bool: bool, short: str | None) -> list[list[str]]:
    """Every way pflag accepts to write ``name`` = ``value``."""
    if is_bool:
        forms = [[f"--{name}={value}"], [f"-{name}={value}"]]
        if value == "true":
            forms += [[f"--{name}"], [f"-{name}"]]
        return forms
    forms = [[f"--{name}={value}"], [f"--{name}", value], [f"-{name}={value}"], [f"-{name}", value]]
    if short is not None:
        forms += [[f"-{short}={value}"], [f"-{short}", value]]
        if value and not value.startswith("="):
            forms.append([f"-{short}{value}"])
    return forms


@st.composite
def command_lines(
    draw: st.DrawFn,
) -> tuple[dict[str, bool], dict[str, str], list[tuple[str, str]], list[str]]:
    is_bool, shorthands = draw(flag_sets())
    short_of = {n: s for s, n in shorthands.items()}
    pairs = []
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(sorted(is_bool)))
        value = draw(st.sampled_from(("true", "false", "1", "0")) if is_bool[name] else values)
        pairs.append((name, value))
        argv += draw(st.sampled_from(spellings(name, value, is_bool[name], short_of.get(name))))
    if draw(st.booleans()):
        argv.append("--")
    return is_bool, shorthands, pairs, argv


def check_scan(line: tuple[dict[str, bool], dict[str, str], list[tuple[str, str]], list[str]]) -> None:
    is_bool, shorthands, pairs, argv = line
    assert list(pflag.scan(argv, is_bool, shorthands)) == pairs, argv


@settings(max_examples=300, deadline=None)
@given(line=command_lines())
def test_every_spelling_yields_the_flags_and_values_in_order(
    line: tuple[dict[str, bool], dict[str, str], list[tuple[str, str]], list[str]],
) -> None:
    """``--n=v``, ``--n v``, ``-n=v``, ``-n v``, shorthands ``-x=v``/``-x v``/``-xv``, bare bools:
    all give the same (name, value) pairs, values verbatim."""
    check_scan(line)


@pytest.mark.fuzz
@settings(max_examples=5000, deadline=None)
@given(line=command_lines())
def test_every_spelling_yields_the_flags_and_values_in_order_long(
    line: tuple[dict[str, bool], dict[str, str], list[tuple[str, str]], list[str]],
) -> None:
    """The same, at length (``pytest -m fuzz``)."""
    check_scan(line)


@settings(max_examples=100, deadline=None)
@given(sets=flag_sets(), extra=st.text(min_size=1, max_size=4).filter(lambda a: not a.startswith("-")))
def test_a_positional_argument_stops_the_scan(
    sets: tuple[dict[str, bool], dict[str, str]], extra: str
) -> None:
    """A non-flag argument, after ``--`` or where a bool flag ended, is reported with its context."""
    is_bool, shorthands = sets
    name = sorted(is_bool)[0]
    argv = [f"--{name}", extra] if is_bool[name] else [f"--{name}=v", "--", extra]
    with pytest.raises(pflag.PositionalArgument) as raised:
        list(pflag.scan(argv, is_bool, shorthands))
    assert raised.value.argument == extra
    assert raised.value.after_bool == (f"--{name}" if is_bool[name] else None)


@settings(max_examples=100, deadline=None)
@given(sets=flag_sets(), unknown=names)
def test_unknown_and_incomplete_flags_fail_with_pflags_messages(
    sets: tuple[dict[str, bool], dict[str, str]], unknown: str
) -> None:
    is_bool, shorthands = sets
    if unknown not in is_bool:
        with pytest.raises(pflag.FlagSyntaxError, match=f"^unknown flag: --{unknown}$"):
            list(pflag.scan([f"--{unknown}=1"], is_bool, shorthands))
    for name, boolean in is_bool.items():
        if not boolean:
            with pytest.raises(pflag.FlagSyntaxError, match=f"^flag needs an argument: --{name}$"):
                list(pflag.scan([f"--{name}"], is_bool, shorthands))
    for short in shorthands:
        with pytest.raises(pflag.FlagSyntaxError, match=f"^flag needs an argument: '{short}' in -{short}$"):
            list(pflag.scan([f"-{short}"], is_bool, shorthands))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["-q"], "unknown shorthand flag: 'q' in -q", id="unknown-shorthand"),
        pytest.param(["-q=1"], "unknown shorthand flag: 'q' in -q=1", id="unknown-shorthand-with-value"),
    ],
)
def test_pflag_messages(argv: list[str], message: str) -> None:
    with pytest.raises(pflag.FlagSyntaxError, match=f"^{message}$"):
        list(pflag.scan(argv, {"name": False}, {"v": "name"}))


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--h"], ["-help"], ["--name=1", "-h", "--nope"]])
def test_help_is_its_own_outcome(argv: list[str]) -> None:
    """``-h``/``--help`` stop the scan where they stand, before any later error."""
    with pytest.raises(pflag.HelpFlag):
        list(pflag.scan(argv, {"name": False}))
