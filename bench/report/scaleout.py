"""Section: active-active replicas and workers (bench/scaleout.py, issue 30)."""

# The report is typeset markdown: the multiplication sign is meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, met, ratio, table


def scaleout_section(doc: dict[str, Any]) -> list[str]:
    goals = doc["goals"]
    out = [
        "## Scale-out: active-active replicas and workers",
        "",
        "`python -m bench.scaleout` (see its docstring). Ratios are within one run on this 2-core "
        "machine; every process of a cell shares the two cores.",
        "",
    ]
    q = doc.get("quality")
    if q and "cells" in q:
        out += _quality(q, goals)
    c = doc.get("cost")
    if c and "cells" in c:
        rows = [
            [
                str(x["replicas"]),
                "on" if x["sync"] else "off",
                f(x["cpu_us_per_request"]),
                f(x["p99_ms"], 2),
                f(x["staleness_p99_ms"], 2),
                str(x["failed"]),
            ]
            for x in c["cells"]
        ]
        sc = c["effective_scaling"]
        out += [
            "**Cost of sharing, crowded** (N replicas on this 2-core machine, each driven directly "
            "over ext_proc at the same rate)",
            "",
            table(
                ["replicas", "sync", "CPU µs/request (replica 0)", "p99 ms", "staleness p99 ms", "failed"],
                rows,
            ),
            "",
            "Effective scaling N × cost(1) / cost(N): "
            + _by_n(sc)
            + f" (goals ≥ {goals['scaling_4']} at 4: {met(c['met']['scaling_4'])}; "
            f"≥ {goals['scaling_8']} at 8: {met(c['met']['scaling_8'])}); "
            f"worst staleness p99 {f(c['staleness_p99_ms_worst'], 2)} ms "
            f"(goal ≤ {goals['staleness_p99_ms']} ms, {met(c['met']['staleness'])}).",
            "",
        ]
        out += _uncrowded(c, goals)
        for rate, r in (c.get("by_rate") or {}).items():
            wakes = ", ".join(
                f"{x['replicas']}: {f(x.get('loop_wakes_per_request'), 2)}"
                f" / {f(x.get('received_per_request'), 2)}"
                for x in r["cells"]
                if x["sync"]
            )
            out += [
                f"At {rate} req/s per replica: effective scaling "
                + _by_n(r["effective_scaling"])
                + "; sync on ÷ off at the same N "
                + _by_n(r["sync_on_vs_off_same_n"])
                + f"; staleness p99 worst {f(r['staleness_p99_ms_worst'], 2)} ms; loop wakes / batches "
                f"received per request (sync on) {wakes}" + _overloaded(r) + ".",
                "",
            ]
            u = r.get("uncrowded")
            if u:
                out += [
                    f"At {rate} req/s, uncrowded (one EPP, peers replayed): effective scaling "
                    + _by_n(u["effective_scaling"])
                    + "; cost ÷ one alone "
                    + _by_n(u["sync_on_vs_alone"])
                    + f"; replica 0's staleness p99 worst {f(u['staleness_p99_ms_worst'], 2)} ms"
                    + _overloaded(u)
                    + ".",
                    "",
                ]
    w = doc.get("workers")
    if w and "rounds" in w:
        rows = [
            [
                str(i + 1),
                f(r["one"]["rps"]),
                f(r["one"]["p99_ms"], 2),
                f(r["two"]["rps"]),
                f(r["two"]["p99_ms"], 2),
                ratio(r["ratio"]),
                ratio(r.get("per_epp_core_ratio")),
            ]
            for i, r in enumerate(w["rounds"])
        ]
        headers = ["round", "1 worker req/s", "p99 ms", "2 workers req/s", "p99 ms", "ratio", "per EPP core"]
        out += [
            "**Workers** (`--workers 2` vs `1`, closed loop over ext_proc, no Envoy)",
            "",
            table(headers, rows),
            "",
            f"Median capacity ratio {ratio(w['capacity_ratio_median'])} at the same streams "
            f"(goal ≥ {goals['workers_2']}×, {met(w['met']['capacity'])}; "
            f"p99 no worse: {met(w['met']['p99_no_worse'])}).",
            "",
        ]
        if "capacity_ratio_at_same_p99_median" in w:  # the goal's own reading (bench.scaleout.rps_at_p99)
            at = [ratio(r.get("ratio_at_same_p99")) for r in w["rounds"]]
            out += [
                f"At the same p99 (two workers' rate where their p99 meets one worker's, read off cells "
                f"at 64, 96 and 128 streams): median {ratio(w['capacity_ratio_at_same_p99_median'])} "
                f"(rounds {' / '.join(at)}; goal ≥ {goals['workers_2']}×, "
                f"{met(w['met']['capacity_at_same_p99'])}).",
                "",
            ]
        if "per_epp_core_ratio_median" in w:  # where the cores went (docs/workers.md)
            shared = (
                " Other tenants shared the machine: the raw ratio says little." if w["shared_machine"] else ""
            )
            out += [
                f"Requests per EPP core, two workers vs one: {ratio(w['per_epp_core_ratio_median'])}; "
                f"load client {f(w['client_us_per_request_median'], 1)} µs/request; "
                f"modelled raw ratio on a dedicated 2-core machine {ratio(w['dedicated_two_cores_ratio'])}; "
                f"cores busy outside the cell {f(w['machine_rest_cores_median'], 2)}.{shared} "
                f"Rounds with the machine to itself: {w.get('quiet_rounds', 0)}, median ratio "
                f"{ratio(w.get('quiet_ratio_median'))}.",
                "",
            ]
    fl = doc.get("faults")
    if fl and "kill" in fl:
        k, r, ro = fl["kill"], fl["restart"], fl["rolling"]
        out += [
            "**Faults** (three shared replicas behind Envoy, 50 req/s)",
            "",
            f"- SIGKILL of one replica: {k['failed_total']} requests failed in all, {k['failed_after_1s']} "
            f"more than 1 s after the kill ({met(fl['met']['kill'])}).",
            f"- Restarted with a warm start: its first requests' predicted prefix hit ratio "
            f"{f(r['restarted_hit_ratio'], 3)} vs its peers' {f(r['peers_hit_ratio'], 3)} "
            f"({ratio(r['vs_peers'])}, {met(fl['met']['warm_start'])}).",
            f"- Rolling update of all three: {ro['failed']} of {ro['sent']} requests failed "
            f"({met(fl['met']['rolling'])}).",
            "",
        ]
    b = doc.get("busy")
    if b and "cells" in b:
        out += _busy(b, goals)
    for part in ("quality", "cost", "busy", "workers", "faults"):
        if doc.get(part, {}).get("error"):
            out += [f"*Part {part} failed: {doc[part]['error']}*", ""]
    return out


def _uncrowded(c: dict[str, Any], goals: dict[str, Any]) -> list[str]:
    """The cost cells where replica 0 is the only EPP and its peers are replayed by one process."""
    u = c.get("uncrowded")
    if not u:
        return []
    rows = _rows(
        u["cells"],
        ("cpu_us_per_request", 1),
        ("loop_wakes_per_request", 2),
        ("received_per_request", 2),
        ("p99_ms", 2),
        ("staleness_p99_ms", 2),
        ("replayer_cpu_s", 2),
    )
    sc = u["effective_scaling"]
    return [
        "**Cost of sharing, uncrowded** (replica 0 the only EPP on the machine; its N − 1 peers replayed "
        "by one process, `bench/scaleout_peers`: real hubs, plugins and routing, the same prompts on the "
        "same schedule; the crowded cells above charge N processes on 2 cores to the sync)",
        "",
        table(
            [
                "replicas",
                "CPU µs/request (replica 0)",
                "loop wakes / request",
                "batches received / request",
                "p99 ms",
                "staleness p99 ms (on replica 0)",
                "replayer CPU s",
            ],
            rows,
        ),
        "",
        "Effective scaling N × cost(1) / cost(N), uncrowded: "
        + _by_n(sc)
        + f" (goals ≥ {goals['scaling_4']} at 4: {met(u['met']['scaling_4'])}; "
        f"≥ {goals['scaling_8']} at 8: {met(u['met']['scaling_8'])}); "
        f"worst staleness p99 on replica 0 {f(u['staleness_p99_ms_worst'], 2)} ms "
        f"(goal ≤ {goals['staleness_p99_ms']} ms, {met(u['met']['staleness'])}).",
        "",
    ]


def _rows(cells: list[dict[str, Any]], *columns: tuple[str, int]) -> list[list[str]]:
    """A table's rows: each cell's replicas, then its ``columns`` (key, digits)."""
    return [[str(x["replicas"]), *(f(x.get(key), digits) for key, digits in columns)] for x in cells]


def _busy(b: dict[str, Any], goals: dict[str, Any]) -> list[str]:
    """Part busy: the uncrowded cells at a busy replica's rate, against one replica alone."""
    rows = _rows(
        [b["alone"], *b["cells"]],
        ("cpu_us_per_request", 1),
        ("sent_per_request", 2),
        ("received_per_request", 2),
        ("p99_ms", 2),
        ("staleness_p99_ms", 2),
    )
    return [
        f"**Cost of sharing to a busy replica** ({b['rate']:g} req/s per replica, uncrowded as above; "
        "the first row is one replica alone)",
        "",
        table(
            [
                "replicas",
                "CPU µs/request (replica 0)",
                "batches sent / request",
                "batches received / request",
                "p99 ms",
                "staleness p99 ms",
            ],
            rows,
        ),
        "",
        "Effective scaling N × cost(1) / cost(N) at this rate: "
        + _by_n(b["effective_scaling"])
        + f" (goals ≥ {goals['scaling_4']} at 4, ≥ {goals['scaling_8']} at 8); worst staleness p99 "
        f"{f(b['staleness_p99_ms_worst'], 2)} ms" + _overloaded(b) + ".",
        "",
        *_crowding(b),
    ]


def _crowding(b: dict[str, Any]) -> list[str]:
    """The busy part's control cells (the replayer beside replica 0, sync off), when run."""
    control = b.get("controls")
    if not control:
        return []
    return [
        "Control: the same replayer beside replica 0 with sync off costs it "
        + _by_n(control["vs_alone"])
        + " × one replica alone (CPU µs/request "
        + ", ".join(f"{c['replicas']}: {f(c['cpu_us_per_request'], 1)}" for c in control["cells"])
        + "); the sync's own cost, each round's synced cell less its control: "
        + ", ".join(f"{n}: {f(v, 1)} µs" for n, v in b["sync_own_us_per_request"].items())
        + " a request, so on cores of their own (an estimate) N × cost(1) / (cost(1) + that) = "
        + _by_n(b["scaling_without_crowding_estimate"])
        + ".",
        "",
    ]


def _span(c: dict[str, Any], key: str, nd: int = 1) -> str:
    """A median and, when the cell was repeated, its range."""
    rng = c.get(f"{key}_range")
    spread = f" ({f(rng[0], nd)}–{f(rng[1], nd)})" if rng and c.get("repeats", 1) > 1 else ""
    return f(c[key], nd) + spread


def _quality(q: dict[str, Any], goals: dict[str, Any]) -> list[str]:
    rows = [
        [
            str(c["replicas"]),
            "shared" if c["sync"] else "independent",
            _span(c, "ttft_p90_ms"),
            f(c.get("engine_ttft_p90_ms")),
            _span(c, "prefix_hit_rate", 3),
            f"{f(c.get('waiting_mean'), 2)} / {f(c.get('longest_mean'), 2)}",
            f(c["success_rate"], 3),
        ]
        for c in q["cells"]
    ]
    repeats = q.get("repeats", 1)
    run_alone = f" Run on its own by `{q['command']}`, {q['finished']}." if q.get("command") else ""
    per_round = ", ".join(ratio(x) for x in q.get("ttft_p90_4_synced_vs_one_per_round", []))
    return [
        "**Routing quality** (shared-prefix profile through one Envoy, approximate prefix index; "
        f"median of {repeats} run(s) per cell, range in brackets)",
        "",
        table(
            [
                "EPP replicas",
                "routing state",
                "TTFT p90 (ms)",
                "engines' TTFT p90 (ms, modelled)",
                "fleet hit rate",
                "waiting: fleet / longest queue",
                "success",
            ],
            rows,
        ),
        "",
        f"4 shared replicas vs one: TTFT p90 {ratio(q['ttft_p90_4_synced_vs_one'])} (goal ≤ "
        f"{goals['quality_ttft_p90_vs_one']}×, {met(q['met']['ttft'])}; per round {per_round or '–'}), "
        f"hit rate {ratio(q['hit_rate_4_synced_vs_one'])} (goal ≥ {goals['quality_hit_rate_vs_one']}×, "
        f"{met(q['met']['hits'])}).{run_alone}",
        "",
    ]


def _by_n(values: dict[str, Any]) -> str:
    """``{replicas: value}`` as "2: 1.49, 4: 2.61" (two decimals)."""
    return ", ".join(f"{n}: {f(v, 2)}" for n, v in values.items())


def _overloaded(rate: dict[str, Any]) -> str:
    """ "; overloaded: <cells>" when a rate had overloaded cells, else nothing."""
    cells = rate.get("overloaded_cells")
    return f"; overloaded: {', '.join(cells)}" if cells else ""
