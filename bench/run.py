"""The benchmark runner behind ``make bench`` / ``make bench-quick``: every comparison, then the report.

    python -m bench.run --mode quick|full [--only routing,overhead,...] [--skip-setup]

Full mode first installs the peer routers, inference-perf and the local tokenizer
(``python -m bench.setup``, idempotent); quick mode never downloads anything and uses the peers
only if already installed.  Each step runs as its own subprocess with its output streamed here
(progress lines), so one failing step is recorded and the others still run.  Writes
bench/results/<step>.json, bench/results/run.json (steps, commands, wall times, exit codes,
machine, versions) and then bench/REPORT.md with bench/plots/*.png.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from bench.common import ROOT, log, machine_info, read_result, versions, write_result

# (name, module, takes --quick): the order runs the heavy end-to-end comparisons first.
STEPS: tuple[tuple[str, str, bool], ...] = (
    ("routing", "bench.routing", True),
    ("prefix_routing", "bench.prefix_routing", True),
    ("overhead", "bench.overhead", True),
    ("long_prompts", "bench.long_prompts", True),
    ("streaming", "bench.streaming", True),
    ("envoy_phases", "bench.envoy_phases", True),
    ("scheduler", "bench.scheduler", True),
    ("explain", "bench.explain", True),
    ("scrape", "bench.scrape", True),
    ("parsers", "bench.parsers", True),
    ("flowcontrol", "bench.flowcontrol", True),
    ("sim_cost", "bench.sim_cost", True),
    ("latency", "bench.latency", True),
    ("failover", "bench.failover", True),
    ("gray_failures", "bench.gray_failures", True),
    ("reload", "bench.reload", True),
    ("precise_prefix", "bench.precise_prefix", True),
    ("pd", "bench.pd", True),
)


def run_step(argv: list[str]) -> tuple[int, float]:
    """Run one step with its output passed through; (exit code, wall seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print("    " + line.rstrip(), flush=True)
    return proc.wait(), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("quick", "full"), default="quick")
    ap.add_argument("--only", default="", help="comma-separated steps: " + ", ".join(s[0] for s in STEPS))
    ap.add_argument("--skip-setup", action="store_true", help="full mode: do not install peers")
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {s[0] for s in STEPS}
    if unknown:
        ap.error(f"unknown steps: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    log(f"bench: {args.mode} mode on {machine_info()['cores']} cores")
    steps: list[dict[str, Any]] = []
    if args.mode == "full" and not args.skip_setup:
        log("bench: setup (peer routers, inference-perf, tokenizer; skipped when present)")
        cmd = [sys.executable, "-m", "bench.setup"]
        code, wall = run_step(cmd)
        steps.append(
            {"step": "setup", "command": "python -m bench.setup", "exit": code, "wall_s": round(wall, 1)}
        )
    selected = [s for s in STEPS if not only or s[0] in only]
    for i, (name, module, quick_flag) in enumerate(selected, 1):
        cmd = [sys.executable, "-m", module]
        if args.mode == "quick" and quick_flag:
            cmd.append("--quick")
        shown = " ".join(["python", *cmd[1:]])
        log(f"bench: [{i}/{len(selected)}] {name}: {shown}")
        code, wall = run_step(cmd)
        log(
            f"bench: [{i}/{len(selected)}] {name} {'done' if code == 0 else f'FAILED (exit {code})'} in "
            f"{wall:.0f} s"
        )
        steps.append({"step": name, "command": shown, "exit": code, "wall_s": round(wall, 1)})
    wall = time.monotonic() - started
    previous = read_result("run")
    command = f"python -m bench.run --mode {args.mode}" + (f" --only {args.only}" if only else "")
    if only and previous and previous.get("mode") == args.mode:
        command = previous.get("command", command)
        # A partial re-run replaces its steps in the record of the last full run of this mode.
        done = {s["step"] for s in steps}
        steps = [s for s in previous.get("steps", []) if s["step"] not in done] + steps
        order = ["setup"] + [s[0] for s in STEPS]
        steps.sort(key=lambda s: order.index(s["step"]) if s["step"] in order else len(order))
        wall = sum(s["wall_s"] for s in steps)
    write_result(
        "run",
        {
            "steps": steps,
            "wall_s": round(wall, 1),
            "versions": versions(),
            "command": command,
        },
        mode=args.mode,
        seeds={},
    )
    if not args.no_report:
        from bench.report import build

        log(f"bench: report written to {build()}")
    failed = [s["step"] for s in steps if s["exit"] != 0]
    log(
        f"bench: finished in {wall / 60:.1f} min" + (f"; FAILED steps: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
