"""Section 1b: cache-aware routing (llm-d's shared-prefix profile, a conversation replay) and its goals."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, met, ratio, table


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def prefix_routing_section(r: dict[str, Any]) -> list[str]:
    out = ["## 1b. Cache-aware routing: llm-d's shared-prefix profile and a conversation replay", ""]
    out += [f"- {n}" for n in r.get("notes", [])]
    if r.get("notes"):
        out.append("")
    judged = r.get("judged_profile") or "llm-d-73"
    sections = shared_sections(r)
    for name in sorted(sections, key=lambda n: n != judged):
        out += _shared(sections[name])
    cv = r.get("conversation")
    if cv:
        out += _conversation(cv)
    pr = r.get("precise")
    if pr:
        out += _precise(pr)
    return out


def shared_sections(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The shared-prefix tables per profile (a result from before the profiles: cache-pressure)."""
    sh = r.get("shared") or {}
    if "cells" in sh:
        return {"cache-pressure": {**sh, "profile": {"name": "cache-pressure", "judged": False, "why": ""}}}
    return dict(sh)


def _runs(cell: dict[str, Any]) -> str:
    """A repeated cell (``--repeat``) is its median run: say so, with the spread of TTFT p90."""
    p90s = [r["ttft_p90_ms"] for r in cell.get("runs", []) if "ttft_p90_ms" in r]
    if len(cell.get("runs", [])) < 2:
        return ""
    spread = f", TTFT p90 {min(p90s):,.0f} to {max(p90s):,.0f} ms" if p90s else ""
    return f" (median of {len(cell['runs'])} runs{spread})"


def _sizing(wl: dict[str, Any]) -> str:
    unique = wl.get("unique_tokens")
    return (
        f"System prompts {wl['working_set_tokens']:,} tokens = **{wl['working_set_over_fleet_kv']:.0%} of "
        f"the fleet's KV cache** ({wl['kv_blocks']:,} blocks × {wl['block_size']} per replica, "
        f"{wl['fleet_kv_tokens']:,} tokens)"
        + (
            f"; every unique token (prompts, questions, outputs) {unique:,} = "
            f"{wl['unique_over_fleet_kv']:.2f}× it"
            if unique
            else ""
        )
        + ". "
    )


def _shared(sh: dict[str, Any]) -> list[str]:
    wl = sh["workload"]
    d = sh["derived"]
    at = d.get("highest_rate_rr_completes")
    prof = sh.get("profile") or {}
    name = prof.get("name", "")
    head = f"### Shared-prefix profile `{name}`" + (" (goals judged here)" if prof.get("judged") else "")
    out = [
        head,
        "",
        *([f"{prof['why']}.", ""] if prof.get("why") else []),
        f"llm-d's benchmark profile scaled to this machine: {wl['groups']} groups × "
        f"{wl['prompts_per_group']} prompts, a {wl['system_tokens']:,}-token system prompt shared within a "
        f"group, a {wl['question_tokens']:,}-token question, {wl['output_tokens']} output tokens (llm-d: "
        "1,000; every streamed token costs real CPU here), Poisson arrivals at rising rates, each cell on a "
        f"fresh fleet of {wl['replicas']} simulated replicas. "
        + _sizing(wl)
        + f"Load generator: **{sh['loadgen']}**. Goals are judged at the "
        f"highest rate round robin still completes (≥ 99% success): **{f(at, 0)} req/s**.",
        "",
    ]
    rows = []
    order = list(sh["routers"])
    for c in sorted(
        sh["cells"], key=lambda c: (c["rate"], order.index(c["router"]) if c["router"] in order else 99)
    ):
        if "failed" in c:
            rows.append([f"{c['rate']:g}", sh["routers"].get(c["router"], c["router"]), "failed", *[""] * 9])
            continue
        rt = d["ratios"].get(c["router"], {}).get(str(c["rate"]), {})
        rows.append(
            [
                f"{c['rate']:g}",
                sh["routers"].get(c["router"], c["router"]) + _runs(c),
                f(c["ttft_ms"]["p50"], 0),
                f(c["ttft_ms"]["p90"], 0),
                f(c["output_tokens_per_s"], 0),
                f"{c['success_rate']:.1%}",
                _pct(c["fleet"]["prefix_hit_rate"]),
                f(c["fleet"]["load_imbalance_max_over_mean"], 2),
                ratio(rt.get("ttft_p90_vs_rr")),
                ratio(rt.get("throughput_vs_rr")),
                ratio(rt.get("ttft_p90_vs_sglang")),
                f(c.get("router_cpu_s", {}).get("epp"), 1),
            ]
        )
    out += [
        table(
            [
                "req/s",
                "router",
                "TTFT p50 ms",
                "TTFT p90 ms",
                "output tok/s",
                "success",
                "cache hits",
                "load max/mean",
                "TTFT p90 / RR",
                "tok/s / RR",
                "TTFT p90 / sglang",
                "EPP CPU s",
            ],
            rows,
        ),
        "",
        *_precise_vs_fallback(sh),
        *_ceilings(sh),
        *_bounds(sh),
        "Peak output tokens/s over the rates: "
        + ", ".join(f"{sh['routers'].get(k, k)} {f(v, 0)}" for k, v in d["peak_output_tokens_per_s"].items())
        + ".",
        "",
    ]
    return out


def _ceilings(sh: dict[str, Any]) -> list[str]:
    """What any router could reach: the hit-rate ceilings and the offered output rate."""
    d = sh["derived"]
    ce = d.get("hit_ceilings") or {}
    if not ce:
        return []
    wl = sh["workload"]
    best: dict[str, float] = {}
    for c in sh["cells"]:
        if "failed" not in c:
            key = str(c["rate"])
            best[key] = max(best.get(key, 0.0), c["fleet"]["prefix_hit_rate"])
    per_replica, per_replica_max = wl["groups"] // wl["replicas"], -(-wl["groups"] // wl["replicas"])
    prefix_tokens = per_replica_max * wl["system_tokens"]
    kv = wl["kv_blocks"] * wl["block_size"]
    parts = [
        f"{float(rate):g} req/s: {_pct(v['unbounded'])} with unbounded KV, "
        f"{_pct(v['perfect_placement'])} with perfect placement (best measured {_pct(best.get(rate))})"
        for rate, v in sorted(ce.items(), key=lambda kv: float(kv[0]))
    ]
    return [
        "**Hit-rate ceilings** (bench/hit_ceiling.py: the workload's prompt order replayed against the "
        'fleet\'s caches; "perfect placement" pins each group to one replica and evicts as vLLM does, '
        "a finished request's blocks joining the LRU free queue tail-first): " + "; ".join(parts) + ". "
        f"Every group that is cold once costs a miss, each prompt's {wl['question_tokens']:,}-token "
        f"question is new, and {per_replica}–{per_replica_max} groups per replica "
        f"({per_replica_max} × {wl['system_tokens']:,} prefix tokens, plus their questions and outputs) "
        + ("do not fit" if prefix_tokens > kv else "fit only partly beside their questions and outputs in")
        + f" its {kv:,} tokens of KV, so an LRU cache loses prefixes even "
        "under perfect routing. Output tokens/s cannot exceed the offered rate × "
        f"{wl['output_tokens']} tokens, which bounds the throughput ratio to round robin.",
        "",
    ]


def _bound(b: dict[str, Any]) -> str:
    return (
        f"{_pct(b['hit_rate'])}: {f(b['capacity_req_s'], 1)} req/s, ≤ {f(b['max_output_tokens_per_s'], 0)} "
        f"tok/s, ≥ {f(b['min_ttft_p90_ms'], 0)} ms"
    )


def _bounds(sh: dict[str, Any]) -> list[str]:
    """What any router could get out of the fleet at the hit ceilings (bench/hit_ceiling.fleet_bounds)."""
    fb = sh["derived"].get("fleet_bounds") or {}
    if not fb:
        return []
    rows = []
    for rate, b in sorted(fb.items(), key=lambda kv: float(kv[0])):
        pp, ub, rr = b["perfect_placement"], b["unbounded"], b["round_robin_model"]
        vm, vo, need = b["best_ratios_vs_rr_measured"], b["best_ratios_vs_rr_model"], b["hit_rate_needed"]
        rows.append(
            [
                f"{float(rate):g}",
                _bound(pp),
                _bound(ub),
                _bound(rr),
                f"{ratio(vm['throughput_vs_rr'])} ({ratio(vo['throughput_vs_rr'])})",
                f"{ratio(vm['ttft_p90_vs_rr'])} ({ratio(vo['ttft_p90_vs_rr'])})",
                f"{_pct(need['throughput_vs_rr'])} / {_pct(need['ttft_p90_vs_rr'])}",
            ]
        )
    return [
        "**What any router could get out of this fleet** (bench/hit_ceiling.py `fleet_bounds`, the "
        "simulator's time model: a request costs its replica at least prefill 0.05 ms × uncached "
        "tokens + the step base shared by full 8,192-token chunks + 100 decode steps at 0.08 ms + 0.04 ms "
        "per 1k context, so the fleet serves at most C requests/s; output tok/s ≤ 100 × min(rate, C); with "
        "first-come-first-served engines and perfect balance the request at the 90th percentile of "
        "arrivals waits (rate − C) × 0.9 × 30 s / C, a lower bound on TTFT p90). Best case = the "
        "perfect-placement hit ceiling; in brackets the same ratio against round robin as the model "
        "predicts it (the model is optimistic for every router: round robin measures below its bound "
        "too).",
        "",
        table(
            [
                "req/s",
                "perfect placement: hits, capacity, tok/s, TTFT p90",
                "unbounded KV",
                "round robin (measured hits)",
                "best tok/s / RR",
                "best TTFT p90 / RR",
                "hits needed for 2× tok/s / 0.1× TTFT",
            ],
            rows,
        ),
        "",
    ]


FALLBACK_FLAG_POINTS = 0.01  # hit-rate shortfall, as a fraction, that gets a line


def _precise_vs_fallback(sh: dict[str, Any]) -> list[str]:
    """Flag a rate where the precise scorer hit the cache at least a point less than its own
    approximate fallback (no events) or the approximate index."""
    by = {(c["router"], c["rate"]): c for c in sh["cells"] if "failed" not in c}
    out = []
    for (router, rate), off in by.items():
        on = by.get(("epp-precise", rate))
        if router not in ("epp-precise-no-events", "epp-approx") or on is None:
            continue
        # a point or more: run-to-run spread on this machine is about that, and a rounding
        # difference ("67% vs 67%") is not worth a line
        if on["fleet"]["prefix_hit_rate"] <= off["fleet"]["prefix_hit_rate"] - FALLBACK_FLAG_POINTS:
            out += [
                f"At {rate:g} req/s the precise scorer hit the cache less than "
                + (
                    "the same config without events (falling back to the approximate index)"
                    if router == "epp-precise-no-events"
                    else "the approximate index"
                )
                + f": {_pct(on['fleet']['prefix_hit_rate'])} vs "
                f"{_pct(off['fleet']['prefix_hit_rate'])}, TTFT p90 {f(on['ttft_ms']['p90'], 0)} vs "
                f"{f(off['ttft_ms']['p90'], 0)} ms.",
                "",
            ]
    return out


def _conversation(cv: dict[str, Any]) -> list[str]:
    wl = cv["workload"]
    out = [
        "### Conversation replay (session affinity)",
        "",
        f"inference-perf `conversation_replay`: {wl['slots']} conversations at a time, {wl['turns']} "
        f"turns each, {wl['rounds']} after one another per slot; every prompt is the whole history (a "
        f"{wl['shared_system_tokens']:,}-token system prompt shared by all, {wl['dynamic_system_tokens']} "
        f"per conversation, {wl['input_tokens']} new tokens and {wl['output_tokens']} output tokens per "
        f"turn); the session id rides in `x-session-token`. {wl['replicas']} replicas with "
        f"{wl['kv_blocks']:,} KV blocks each. **Follow-up hit** = cached / prompt tokens over turns 2+, "
        "from the replicas' `usage.prompt_tokens_details.cached_tokens`; **context reuse** = the share of "
        "what the previous turn left (its prompt and output) that was found cached.",
        "",
    ]
    rows = []
    order = list(cv["routers"])
    for c in sorted(cv["cells"], key=lambda c: order.index(c["router"]) if c["router"] in order else 99):
        label = cv["routers"].get(c["router"], c["router"])
        if "failed" in c:
            rows.append([label, "failed", *[""] * 7])
            continue
        rows.append(
            [
                label,
                _pct(c.get("followup_hit_rate")),
                _pct(c.get("followup_context_reuse")),
                f(c["followup_ttft_ms"]["p50"], 0),
                f(c["followup_ttft_ms"]["p90"], 0),
                f(c["first_turn_ttft_ms"]["p50"], 0),
                f(c["output_tokens_per_s"], 0),
                f"{c['ok']}/{c['requests']}",
                f(c["fleet"]["load_imbalance_max_over_mean"], 2),
            ]
        )
    stacked = [
        f"{cv['routers'].get(c['router'], c['router'])} ({max(c['fleet']['requests_per_replica'])} of "
        f"{sum(c['fleet']['requests_per_replica'])} requests on one replica)"
        for c in cv["cells"]
        if "failed" not in c and (c["fleet"]["load_imbalance_max_over_mean"] or 0) >= 4
    ]
    if stacked:
        out += [
            "Conversations that share a system prompt stacked on one replica under: "
            + ", ".join(stacked)
            + ".",
            "",
        ]
    out += [
        table(
            [
                "router",
                "follow-up hit",
                "context reuse",
                "follow-up TTFT p50 ms",
                "p90",
                "first-turn TTFT p50 ms",
                "output tok/s",
                "ok",
                "load max/mean",
            ],
            rows,
        ),
        "",
    ]
    return out


def _precise(pr: dict[str, Any]) -> list[str]:
    out = ["### Precise scorer: predicted vs observed reuse, event-processing cost", ""]
    out += [f"- {line}" for line in pr.get("lines", [])]
    out.append("")
    return out


def prefix_routing_goal_rows(r: dict[str, Any] | None) -> list[list[str]]:
    if not r:
        return []
    rows: list[list[str]] = []
    judged = r.get("judged_profile") or "llm-d-73"
    sections = shared_sections(r)
    for pname in sorted(sections, key=lambda n: n != judged):
        rows += _profile_goal_rows(pname, sections[pname], pname == judged)
    cv = r.get("conversation") or {}
    for name, g in cv.get("goals", {}).items():
        label = cv["routers"].get(name, name)
        rows.append(
            [
                f"1b conversations ({label})",
                "follow-up-turn cache hit ≥ 0.85",
                f(g["value"], 3),
                met(g["met"]),
            ]
        )
    for g in (r.get("precise") or {}).get("goals", []):
        suffix = "" if g.get("judged", True) else " — reported, not judged"
        rows.append(
            [f"1b precise scorer ({g['what']}){suffix}", g["goal_text"], f(g["value"], 3), met(g["met"])]
        )
    return rows


def _profile_goal_rows(pname: str, sh: dict[str, Any], judged: bool) -> list[list[str]]:
    rows: list[list[str]] = []
    suffix = "" if judged else " — reported, not judged"
    for name, g in (sh.get("derived") or {}).get("goals", {}).items():
        label = sh["routers"].get(name, name)
        at = f"{g['at_rate']:g} req/s"
        where = f"1b shared prefix `{pname}` ({label}, {at}){suffix}"
        rows += [
            [where, "TTFT p90 ≤ 0.1× round robin", ratio(g["ttft_p90_vs_rr"]["value"]),
             met(g["ttft_p90_vs_rr"]["met"])],
            [where, "output tok/s ≥ 2× round robin", ratio(g["throughput_vs_rr"]["value"]),
             met(g["throughput_vs_rr"]["met"])],
            [where, "TTFT p90 ≤ 0.8× sglang-router cache_aware", ratio(g["ttft_p90_vs_sglang"]["value"]),
             met(g["ttft_p90_vs_sglang"]["met"])],
        ]  # fmt: skip
    derived = sh.get("derived") or {}
    top = derived.get("highest_rate_rr_completes")
    bound = (derived.get("fleet_bounds") or {}).get(str(top))
    if bound:
        best = bound["best_ratios_vs_rr_measured"]
        place = f"1b shared prefix `{pname}` (any router at the perfect-placement hit ceiling, {top:g} req/s)"
        rows += [
            [place, "TTFT p90 ≤ 0.1× round robin", f"≥ {ratio(best['ttft_p90_vs_rr'])}",
             "out of reach" if (best["ttft_p90_vs_rr"] or 0) > 0.1 else "reachable"],
            [place, "output tok/s ≥ 2× round robin", f"≤ {ratio(best['throughput_vs_rr'])}",
             "out of reach" if (best["throughput_vs_rr"] or 0) < 2.0 else "reachable"],
        ]  # fmt: skip
    return rows
