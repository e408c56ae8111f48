"""Formatting shared by the report's sections: numbers, tables, plots, py-spy profiles."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.common import PLOTS


def f(x: Any, nd: int = 1, unit: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) and not nd:
        return f"{x:,}{unit}"
    if isinstance(x, (int, float)):
        if abs(x) >= 1000 and nd <= 1:
            return f"{x:,.0f}{unit}"
        return f"{x:.{nd}f}{unit}"
    return str(x)


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def met(m: Any) -> str:
    return "**met**" if m else "not met"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(fig: Any, name: str) -> str:
    PLOTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(PLOTS / name, dpi=110)
    pyplot().close(fig)
    return f"plots/{name}"


def profile_section(prof: dict[str, Any] | None, title: str, top: int = 10) -> list[str]:
    if not prof:
        return []
    if "error" in prof:
        return [f"*{title}: profile not available ({prof['error']}).*", ""]
    rows = [[f"`{e['function']}`", f"{e['share']:.1%}"] for e in prof["self"][:top]]
    incl = [[f"`{e['function']}`", f"{e['share']:.1%}"] for e in prof["inclusive"][:top]]
    return [
        f"**{title}** ({prof['samples']:,} py-spy samples of busy threads)",
        "",
        "Self time (where the CPU is spent):",
        "",
        table(["function", "share"], rows),
        "",
        "Inclusive time (what the time is spent under):",
        "",
        table(["function", "share"], incl),
        "",
    ]


def quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def difference(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None
