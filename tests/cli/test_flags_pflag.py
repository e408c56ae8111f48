"""pflag's command-line syntax, as properties on hypothesis-generated command lines.

There is no Python implementation of Go's pflag to compare ``parse_flags`` with, so these
check what pflag documents: ``--name=value``, ``--name value``, Go's single-dash
``-name=value`` and, for ``-v``, ``-v=3``/``-v3``/``-v 3`` all mean the same; a bool flag takes
its value inline only; flags may come in any order; the last of a repeated flag wins; an
int flag reads any Go integer literal (``strconv.ParseInt(s, 0, 64)``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.cli.flags import parse_flags
from epp.units import format_go_duration_ns

BASE = ["--endpoints=10.0.0.1:8000"]
# name -> strategy of the value's canonical text; ports in disjoint ranges so they never collide.
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "grpc-port": st.integers(1000, 1999),
    "grpc-health-port": st.integers(2000, 2999),
    "metrics-port": st.integers(3000, 3999),
    "secure-serving": st.booleans(),
    "enable-pprof": st.booleans(),
    "v": st.integers(1, 5),
    "refresh-metrics-interval": st.integers(1, 10_000).map(lambda ms: format_go_duration_ns(ms * 1_000_000)),
    "log-format": st.sampled_from(("json", "console")),
    "pool-group": st.sampled_from(("inference.networking.k8s.io", "x.example.com")),
}
BOOLS = {"secure-serving", "enable-pprof"}
INTS = {"grpc-port", "grpc-health-port", "metrics-port", "v"}


def canonical(name: str, value: Any) -> list[str]:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return [f"--{name}={text}"]


def int_spellings(n: int) -> list[str]:
    """Go integer literals for ``n`` (n > 0): decimal, hex, octal (both forms), binary, with ``_``."""
    return [str(n), hex(n), f"0X{n:X}", f"0{n:o}", f"0o{n:o}", f"0b{n:b}", f"+{n}", "_".join(str(n))]


@st.composite
def spelled(draw: st.DrawFn, name: str, value: Any) -> list[str]:
    """One of pflag's spellings of ``--name=value``."""
    if name in BOOLS:
        if value:
            return draw(st.sampled_from(([f"--{name}"], [f"--{name}=true"], [f"-{name}"], [f"--{name}=1"])))
        return draw(
            st.sampled_from(([f"--{name}=false"], [f"-{name}=false"], [f"--{name}=0"], [f"--{name}=F"]))
        )
    text = draw(st.sampled_from(int_spellings(value))) if name in INTS else str(value)
    forms: tuple[list[str], ...]
    if name == "v" and len(text) == 1:  # shorthand forms
        forms = ([f"-v={text}"], [f"-v{text}"], ["-v", text], [f"--v={text}"], ["--v", text])
    else:
        forms = ([f"--{name}={text}"], [f"--{name}", text], [f"-{name}={text}"], [f"-{name}", text])
    return draw(st.sampled_from(forms))


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """The same settings written canonically, and written with random spellings, order and repeats."""
    names = draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True, max_size=len(VALUES)))
    settings_ = {n: draw(VALUES[n]) for n in names}
    plain = [arg for n in names for arg in canonical(n, settings_[n])]
    parts: list[tuple[str, list[str]]] = []
    for n in names:
        # A repeated flag: earlier occurrences with other values; the last one wins.
        for _ in range(draw(st.integers(0, 2))):
            parts.append((n, draw(spelled(n, draw(VALUES[n])))))
        parts.append((n, draw(spelled(n, settings_[n]))))
    # Any order of the flags, each flag's own occurrences kept in order (the last stays last).
    pending: dict[str, list[list[str]]] = {}
    for n, argv in parts:
        pending.setdefault(n, []).append(argv)
    fancy: list[str] = []
    for i in draw(st.permutations(range(len(parts)))):
        fancy.extend(pending[parts[i][0]].pop(0))
    return plain, fancy


def check_same(plain: list[str], fancy: list[str]) -> None:
    expected = parse_flags([*BASE, *plain], {})
    got = parse_flags([*BASE, *fancy], {})
    assert got == expected, (plain, fancy)


@settings(max_examples=150, deadline=None)
@given(lines=command_lines())
def test_spellings_order_and_repeats_mean_the_same(lines: tuple[list[str], list[str]]) -> None:
    check_same(*lines)
