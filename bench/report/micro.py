"""Section 5: the micro-benchmarks (scheduler, scrape, parsers, flow control, simulator cost)."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, met, quotient, ratio, table


def micro_section(res: dict[str, dict[str, Any] | None]) -> list[str]:
    out = [
        "## 5. Scale of the decision (micro-benchmarks)",
        "",
        "Run by the same harness from their own modules (`python -m bench.<name>`); each measures its "
        "baseline in the same run.",
        "",
    ]
    sch = res.get("scheduler")
    if sch:
        rows = [
            [
                f(c["endpoints"], 0),
                f(c["prompt_chars"], 0),
                f(c["prepare_us"]["p50"]),
                f(c["schedule_us"]["p50"]),
                f(c["total_us"]["p50"]),
                f(c["total_us"]["p99"]),
                f(c["pre_request_us"]["p50"]),
            ]
            for c in sch["cells"]
        ]
        g = sch.get("goals", {})
        out += [
            f"**Scheduler** ({sch.get('mode')} mode; {sch.get('profile', '')}), µs:",
            "",
            table(
                [
                    "endpoints",
                    "prompt chars",
                    "prepare p50",
                    "schedule p50",
                    "total p50",
                    "total p99",
                    "pre-request p50",
                ],
                rows,
            ),
            "",
            "Goals (µs): "
            + "; ".join(
                f"`{k}` goal {v.get('goal')}, measured "
                + ", ".join(f"{kk} {vv}" for kk, vv in v.items() if kk != "goal")
                for k, v in g.items()
                if isinstance(v, dict)
            ),
            "",
        ]
    scr = res.get("scrape")
    if scr:
        rows = [
            [
                r["loop"],
                r["page"],
                f(r["endpoints"], 0),
                f(r["scrapes_per_s"], 0),
                f(r["cores"], 3),
                f(r["cpu_us_per_scrape"], 0),
            ]
            for r in scr.get("runtime", [])
        ]
        parse = [
            [
                p["page"],
                f(p["bytes"], 0),
                f(p["ours_wanted_us"]),
                f(p["prometheus_client_us"]),
                ratio(quotient(p["prometheus_client_us"], p["ours_wanted_us"])),
            ]
            for p in scr.get("parse", [])
        ]
        out += [
            f"**Metric scraping** ({scr.get('mode')} mode; goal ≤ {scr.get('goal_cores')} cores for 100 "
            "endpoints "
            "every 50 ms):",
            "",
            table(["loop", "page", "endpoints", "scrapes/s", "cores", "CPU µs/scrape"], rows),
            "",
            table(["page", "bytes", "ours µs", "prometheus_client µs (baseline)", "speed-up"], parse),
            "",
        ]
    par = res.get("parsers")
    if par:
        rows = [
            [
                f(c["bytes"], 0),
                "yes" if c["nested_model_key"] else "no",
                f(c["parse_us"]["p50"]),
                f(c["baseline_orjson_loads_us"]["p50"]),
                f(c["serialize_unchanged_us"]["p50"], 2),
                f(c["serialize_rewritten_us"]["p50"]),
                f(c["baseline_orjson_dumps_us"]["p50"]),
            ]
            for c in par.get("chat_bodies", [])
        ]
        sse = par.get("sse", {})
        out += [
            f"**Parsers** ({par.get('mode')} mode), µs p50:",
            "",
            table(
                [
                    "body bytes",
                    "nested model key",
                    "parse",
                    "orjson.loads (baseline)",
                    "serialize unchanged",
                    "serialize rewritten",
                    "orjson.dumps (baseline)",
                ],
                rows,
            ),
            "",
            "SSE usage parser per chunk: "
            + ", ".join(f"{k} {f(v['us']['p50'], 2)} µs" for k, v in sse.items()),
            "",
        ]
    fc = res.get("flowcontrol")
    if fc:
        fp = fc["fast_path"]
        rows = [
            [t["fairness"], t["ordering"], f(t["enqueues_per_s"], 0), f(t["dispatches_per_s"], 0)]
            for t in fc.get("throughput", [])
        ]
        out += [
            f"**Flow control** ({fc.get('mode')} mode): admission fast path p50 "
            f"{f(fp['flow_control_us']['p50'])} µs vs "
            f"legacy admission {f(fp['legacy_admission_us']['p50'])} µs (baseline, "
            f"{ratio(fp['ratio_p50'])}); "
            f"hand-off p50 {f(fc['handoff']['notify_to_dispatched_us']['p50'])} µs; "
            f"{f(fc['memory']['bytes_per_queued_request'], 0)} B per queued request.",
            "",
            table(["fairness", "ordering", "enqueues/s", "dispatches/s"], rows),
            "",
        ]
    sim = res.get("sim_cost")
    if sim:
        rows = [
            [
                p["name"],
                f(p["rate"], 0),
                f(p["achieved_rate"], 1),
                f(p["tokens_per_s"], 0),
                f(p["sim_cores"], 3),
            ]
            for p in sim.get("phases", [])
        ]
        t = sim.get("target", {})
        out += [
            f"**Simulator cost** ({sim.get('mode')} mode): {f(sim.get('cpu_us_per_request'), 0)} µs per "
            "request, "
            f"{f(sim.get('cpu_us_per_streamed_token'), 1)} µs per streamed token; target "
            f"{f(t.get('rate'), 0)} req/s under {t.get('max_cores')} cores: {met(t.get('pass'))} "
            f"({f(t.get('sim_cores'), 3)} cores).",
            "",
            table(["phase", "req/s offered", "achieved", "tokens/s", "simulator cores"], rows),
            "",
        ]
    return out
