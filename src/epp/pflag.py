"""pflag's command-line syntax: which flag each argument names, and its value as text.

GIE's EPP reads its command line with Go's ``spf13/pflag`` (with the standard ``flag`` set
added): ``--name=value``, ``--name value``, a bool flag alone (``--name`` is ``true``; its
value only inline, ``--name=false``), the single-dash long form of Go's ``flag`` package
(``-name=value``, ``-name value``), and shorthands (``-v=3``, ``-v3``, ``-v 3``).  This module
only splits the command line; converting the text (``strconv``, durations) is
``epp.units``'s, and the flags and their checks are ``epp.app.options``'s.  Errors carry
pflag's messages (``unknown flag: --x``, ``flag needs an argument: --x``, ...).

No reference implementation of pflag exists in Python (argparse's grammar differs: it
takes ``-name`` as shorthand clusters, abbreviates long names, and reads ``--flag`` for a
non-bool differently), so tests/test_pflag.py checks pflag's documented properties on
hypothesis-generated command lines instead.

A leaf: an import-linter contract in pyproject.toml keeps it from importing the EPP.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence


class FlagSyntaxError(ValueError):
    """The command line is not pflag syntax for these flags; the message is pflag's."""


class HelpFlag(Exception):
    """``-h`` or ``--help`` was given."""


class PositionalArgument(Exception):
    """A non-flag argument (or anything after ``--``): the caller decides the message.

    ``after_bool`` names the previous argument when it was a bool flag given without a
    value (``--flag false`` is two arguments to pflag: the flag and a positional ``false``).
    """

    def __init__(self, argument: str, after_bool: str | None) -> None:
        super().__init__(argument)
        self.argument = argument
        self.after_bool = after_bool


def scan(
    argv: Sequence[str], is_bool: Mapping[str, bool], shorthands: Mapping[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """Yield ``(flag name, value text)`` for each flag in ``argv``, in order.

    ``is_bool`` maps every flag name to whether it is a bool flag; ``shorthands`` maps a
    one-letter shorthand to its flag name.  A bool flag without an inline value yields
    ``"true"``.  Raises ``HelpFlag`` on ``-h``/``--help``, ``PositionalArgument`` on the first
    argument that is not a flag (nothing after a trailing ``--``), and ``FlagSyntaxError`` for
    unknown flags and missing values, each when the scan reaches it.
    """
    shorts = shorthands or {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--" or not arg.startswith("-") or arg == "-":
            extra = argv[i:] if arg == "--" else argv[i - 1 :]
            if not extra:
                return
            prev = argv[i - 2] if i >= 2 else ""
            after_bool = None
            if prev.startswith("-") and "=" not in prev and is_bool.get(prev.lstrip("-"), False):
                after_bool = prev
            raise PositionalArgument(extra[0], after_bool)
        name, value, what = _split(arg, is_bool, shorts)
        if value is None:
            if is_bool[name]:
                value = "true"
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise FlagSyntaxError(f"flag needs an argument: {what}")
        yield name, value


def _split(arg: str, is_bool: Mapping[str, bool], shorts: Mapping[str, str]) -> tuple[str, str | None, str]:
    """The flag ``arg`` names, its inline value (None if none), and how errors name it."""
    if arg.startswith("--"):
        name, eq, value = arg[2:].partition("=")
        if name in ("help", "h"):
            raise HelpFlag
        if name not in is_bool:
            raise FlagSyntaxError(f"unknown flag: --{name}")
        return name, value if eq else None, f"--{name}"
    body = arg[1:]
    name, eq, value = body.partition("=")
    if len(name) > 1 and name in is_bool:  # Go's flag package style: -pool-name=x
        return name, value if eq else None, f"--{name}"
    short = body[0]
    if short == "h":
        raise HelpFlag
    long_name = shorts.get(short)
    if long_name is None:
        raise FlagSyntaxError(f"unknown shorthand flag: {short!r} in {arg}")
    rest = body[1:]
    what = f"{short!r} in -{short}"
    if rest.startswith("="):
        return long_name, rest[1:], what
    return long_name, rest or None, what
