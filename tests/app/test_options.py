"""The flag declarations (app/options.py): one per flag, and docs/flags.md says what they say."""

from __future__ import annotations

import re
from pathlib import Path

from epp.app.options import DEFAULTS, FLAGS, Options
from epp.cli.flags import default_text, usage

DOC = Path(__file__).resolve().parents[2] / "docs" / "flags.md"
_ROW = re.compile(
    r"^\| `(?:-\w, )?-?-(?P<name>[\w-]+)`(?:, `--[\w-]+`)? \| (?P<type>\w+) \| `(?P<default>[^`]*)` \|"
)
_TYPE_NAMES = {"bool": "bool", "int": "int", "str": "string", "duration": "duration", "ints": "ints"}


def _doc_rows() -> list[tuple[str, str, str, str, bool]]:
    """(group, flag, type, default, new) for each row of the flag tables, in order."""
    rows = []
    group = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            group = line.removeprefix("### ")
            continue
        m = _ROW.match(line)
        if m is not None:
            name = "v" if line.startswith("| `-v`") else m["name"]
            rows.append((group, name, m["type"], m["default"], line.rstrip().endswith("| **new** |")))
    return rows


def test_every_field_before_the_derived_ones_is_a_flag() -> None:
    """The only Options fields without a flag are the values parsing derives."""
    from dataclasses import fields

    flagless = {f.name for f in fields(Options)} - {f.attr for f in FLAGS}
    assert flagless == {"explicit", "endpoint_selector_labels", "deployment_name", "notices"}


def test_each_group_is_declared_in_one_run() -> None:
    """--help prints each group's heading once: a flag declared away from its group would split it."""
    groups = [f.group for f in FLAGS]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(runs)), runs
    assert usage().count("\nObservability:\n") == 1


def test_docs_list_the_declared_flags_in_order_with_type_default_and_origin() -> None:
    documented = _doc_rows()
    declared = [
        (
            f.group,
            f.name,
            _TYPE_NAMES.get(f.kind, "string"),
            default_text(f),
            f.new,
        )
        for f in FLAGS
    ]
    assert documented == declared


def test_defaults_are_the_declared_defaults() -> None:
    """``DEFAULTS`` is ``Options()``: each flag's default is the one in its declaration."""
    assert DEFAULTS.grpc_port == 9002
    assert DEFAULTS.endpoints == ()
    assert DEFAULTS.explicit == frozenset()
