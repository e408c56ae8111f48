"""Build bench/REPORT.md and bench/plots/*.png from bench/results/*.json (re-runnable on old results).

python -m bench.report

One module per part of the report: ``summary`` (head and goals), ``routing``, ``overhead``,
``long_prompts``, ``streaming``, ``micro`` (the numbered sections), ``findings`` (findings and
suggestions); ``fmt`` holds the formatting they share.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BENCH, PLOTS, log, read_result
from bench.report.latency import latency_section
from bench.report.latency_accuracy import latency_accuracy_section
from bench.report.long_prompts import long_prompts_section
from bench.report.micro import micro_section
from bench.report.overhead import overhead_section
from bench.report.pd import pd_section
from bench.report.prefix_routing import prefix_routing_section
from bench.report.routing import routing_section
from bench.report.scaleout import scaleout_section
from bench.report.streaming import streaming_section
from bench.report.summary import header

REPORT = BENCH / "REPORT.md"


SECTIONS: tuple[tuple[str, Callable[[dict[str, Any]], list[str]]], ...] = (
    ("routing", routing_section),
    ("prefix_routing", prefix_routing_section),
    ("overhead", overhead_section),
    ("long_prompts", long_prompts_section),
    ("streaming", streaming_section),
    ("pd", pd_section),
    ("scaleout", scaleout_section),
    ("latency", latency_section),
)
MICRO = ("scheduler", "scrape", "parsers", "flowcontrol", "sim_cost")


def build() -> Path:
    res: dict[str, dict[str, Any] | None] = {n: read_result(n) for n, _ in SECTIONS}
    res.update({n: read_result(n) for n in MICRO})
    run = read_result("run")
    lines = header(res, run)
    for name, fn in SECTIONS:
        data = res.get(name)
        if data is None:
            lines += [f"## {name}", "", f"*No results (bench/results/{name}.json missing).*", ""]
            continue
        try:
            lines += fn(data)
        except (KeyError, TypeError, ValueError) as e:
            lines += [f"## {name}", "", f"*Could not render bench/results/{name}.json: {e!r}.*", ""]
    try:
        lines += latency_accuracy_section()
    except (KeyError, TypeError, ValueError) as e:
        lines += ["## Latency predictor: TTFT accuracy", "", f"*Could not render: {e!r}.*", ""]
    try:
        lines += micro_section(res)
    except (KeyError, TypeError, ValueError) as e:
        lines += ["## 5. Micro-benchmarks", "", f"*Could not render: {e!r}.*", ""]
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    return REPORT


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0]).parse_args(
        argv
    )
    path = build()
    log(f"report: wrote {path} and {PLOTS}/*.png")
    return 0
