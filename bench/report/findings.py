"""What the results say (findings) and what they suggest doing next."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, quotient, ratio

_LOOP_FRAMES = ("Runner.run (", "Thread.run (", "run (uvloop", "<module>")


def _top_own(prof: dict[str, Any] | None, n: int = 4) -> str:
    """The costliest functions by self time, without the frames that stand for native loop work."""
    if not prof or "self" not in prof:
        return ""
    rows = [e for e in prof["self"] if not e["function"].startswith(_LOOP_FRAMES)][:n]
    return ", ".join(f"`{e['function']}` {e['share']:.0%}" for e in rows)


def findings(res: dict[str, dict[str, Any] | None]) -> list[str]:
    """What the numbers say, computed from them (so a re-run rewrites it)."""
    out: list[str] = []
    r = res.get("routing")
    cells = [c for c in (r or {}).get("cells", []) if "failed" not in c]
    if r and cells:
        top = max(c["rate"] for c in cells)
        at = {c["router"]: c for c in cells if c["rate"] == top}
        rr = at.get("round-robin")
        parts = []
        for name in ("epp-default", "epp-prefix"):
            c = at.get(name)
            if c and rr:
                parts.append(
                    f"{r['routers'][name]}: TTFT p90 {f(c['ttft_ms']['p90'], 0)} ms vs round robin "
                    f"{f(rr['ttft_ms']['p90'], 0)} ms "
                    f"({ratio(quotient(c['ttft_ms']['p90'], rr['ttft_ms']['p90']))}), "
                    f"cache hits {c['fleet']['prefix_hit_rate']:.0%} vs {rr['fleet']['prefix_hit_rate']:.0%}"
                )
        peers = [c for n, c in at.items() if n not in ("epp-default", "epp-prefix", "round-robin")]
        if peers:
            best = min(peers, key=lambda c: c["ttft_ms"]["p90"] or float("inf"))
            parts.append(
                f"best peer {r['routers'][best['router']]}: TTFT p90 {f(best['ttft_ms']['p90'], 0)} ms, "
                f"cache hits {best['fleet']['prefix_hit_rate']:.0%}"
            )
        if parts:
            out.append(f"- **Routing** at {top:g} req/s: " + "; ".join(parts) + ".")
        for c in cells:
            cpu = (c.get("router_cpu_s") or {}).get("epp")
            if c["router"] == "epp-default" and c["rate"] == top and cpu and c.get("ok"):
                idle = c.get("epp_idle_cores")
                out.append(
                    f"- **EPP CPU on the routing workload**: {cpu / c['ok'] * 1e3:.1f} ms per streamed "
                    f"request ({c['ok']} requests with {r['workload']['output_tokens']} tokens each at "
                    f"{top:g} req/s; "
                    "response chunks included"
                    + (
                        f"; plus {f(idle, 3)} cores when idle, scraping the replicas' metrics)."
                        if idle
                        else ")."
                    )
                )
        for c in cells:
            if c.get("profile") and _top_own(c["profile"]):
                selfs = c["profile"].get("self", [])
                loop = sum(e["share"] for e in selfs if e["function"].startswith(_LOOP_FRAMES))
                out.append(
                    f"- **Top Python costs, routing workload** ({c['router']}, {c['rate']:g} req/s): "
                    f"{_top_own(c['profile'])}; {loop:.0%} of the busy samples are native code under the "
                    "event loop (syscalls, uvloop, protobuf)."
                )
    o = res.get("overhead")
    if o:
        cap = o.get("capacity", {})
        epp = (cap.get("epp", {}).get("cpu_us_per_req") or {}).get("extproc")
        floor = (cap.get("floor", {}).get("cpu_us_per_req") or {}).get("extproc")
        if epp and floor and epp <= floor:
            out.append(
                f"- **Where the EPP's CPU goes** (overhead, at capacity): {f(epp, 0)} µs per request, "
                f"everything included, against {f(floor, 0)} µs for the no-op ext_proc floor on grpc.aio: "
                "the EPP's own HTTP/2 transport (docs/decisions.md) saves more than parsing, prefix "
                "hashing, scheduling and metrics cost."
            )
        elif epp and floor:
            out.append(
                f"- **Where the EPP's CPU goes** (overhead, at capacity): {f(epp, 0)} µs per request, of "
                "which the "
                f"no-op ext_proc floor (grpc.aio + protobuf + the protocol's messages) is {f(floor, 0)} µs "
                f"({floor / epp:.0%}); the EPP's own work (parse, prefix hashing, scheduling, metrics) is "
                "the rest, "
                f"{f(epp - floor, 0)} µs."
            )
        own = (cap.get("floor-h2", {}).get("cpu_us_per_req") or {}).get("extproc")
        if epp and own:
            out.append(
                "- **Routing cost over the own floor** (overhead, at capacity): the no-op ext_proc server "
                f"on the EPP's own h2 transport costs {f(own, 0)} µs per request, the EPP {f(epp, 0)} µs: "
                "the EPP's routing work (parse, prefix hashing, scheduling, metrics) is "
                f"{f(epp - own, 0)} µs "
                f"({(epp - own) / epp:.0%} of its CPU per request)."
            )
        prof = o.get("profile") or {}
        py, nat = _top_own(prof.get("python")), _top_own(prof.get("native"))
        if py or nat:
            out.append(
                "- **Top costs in the EPP's profile** (overhead load): Python: "
                + (py or "–")
                + "; native: "
                + (nat or "–")
                + "."
            )
    s = res.get("streaming")
    if s:
        pc = s.get("per_chunk", {})
        fd, fl, skip = pc.get("epp-fd-body", {}), pc.get("floor", {}), pc.get("epp-skip", {})
        if (
            fd.get("extproc_us_per_chunk")
            and fl.get("extproc_us_per_chunk")
            and (fd["extproc_us_per_chunk"] < fl["extproc_us_per_chunk"])
        ):
            out.append(
                f"- **Streaming**: a response chunk costs the EPP {f(fd['extproc_us_per_chunk'], 0)} µs "
                f"with a body plugin, the grpc.aio no-op floor {f(fl['extproc_us_per_chunk'], 0)} µs: "
                "most of a chunk's cost is the message round trip (frame parsing, protobuf, the reply "
                "and its write), not the EPP's chunk handling. With Envoy's buffered/streamed "
                f"modes and nothing needing bodies, the EPP received "
                f"{f(skip.get('extproc_msgs_per_event'), 3)} messages per streamed event."
            )
        elif fd.get("extproc_us_per_chunk") and fl.get("extproc_us_per_chunk"):
            out.append(
                f"- **Streaming**: a response chunk costs the EPP {f(fd['extproc_us_per_chunk'], 0)} µs "
                "with a "
                f"body plugin and the no-op floor {f(fl['extproc_us_per_chunk'], 0)} µs: the per-message "
                "transport, not the EPP's chunk handling, sets the rate. With Envoy's buffered/streamed "
                "modes "
                f"and nothing needing bodies, the EPP received {f(skip.get('extproc_msgs_per_event'), 3)} "
                "messages per streamed event."
            )
        own = pc.get("floor-h2", {}).get("extproc_us_per_chunk")
        if own and fd.get("extproc_us_per_chunk"):
            out.append(
                f"- **Streaming over the own floor**: on the EPP's own h2 transport the no-op server spends "
                f"{f(own, 1)} µs per response chunk, the EPP with a body plugin "
                f"{f(fd['extproc_us_per_chunk'], 1)} µs: "
                + (
                    "the EPP is cheaper than the floor on the same transport, because it hand-encodes its "
                    "body replies (server/wire.py) where the floor builds upb messages."
                    if fd["extproc_us_per_chunk"] < own
                    else f"the EPP's chunk handling costs {f(fd['extproc_us_per_chunk'] - own, 1)} µs."
                )
            )
    lp = res.get("long_prompts")
    if lp:
        d = lp["derived"]
        at400 = d["added"].get("epp", {}).get("400", {}).get("p50_ms_over_floor")
        out.append(
            f"- **Long prompts**: the EPP adds {f(at400, 2)} ms p50 over the floor at 400 KB; at 220 KB and "
            f"concurrency 20 the EPP path adds {f(d.get('epp_added_mean_ms_220kb_c20_over_direct'), 1)} ms "
            "mean over "
            f"direct (GIE reported {f(d.get('go_epp_added_mean_ttft_ms_220kb_c20'), 0)} ms for the Go EPP "
            "path)."
        )
    out += suggestions(res)
    if out:
        out = ["## Findings", "", *out, ""]
    return out


def suggestions(res: dict[str, dict[str, Any] | None]) -> list[str]:
    """What the measured split of costs points at, for whoever optimises next."""
    out: list[str] = []
    o, s, r = res.get("overhead"), res.get("streaming"), res.get("routing")
    cap = (o or {}).get("capacity", {})
    epp = (cap.get("epp", {}).get("cpu_us_per_req") or {}).get("extproc")
    floor = (cap.get("floor", {}).get("cpu_us_per_req") or {}).get("extproc")
    if epp and floor and floor >= epp:
        out.append(
            "- *Suggests*: with the transport no longer dominant, the remaining cost per request is "
            "spread thin (profile above): write syscalls, protobuf access to Envoy's header maps "
            "(`headers_to_dict`), the prefix index, the director. Fewer writes per request (Envoy "
            "answers each message separately) and decoding header maps from the wire bytes are the "
            "next factors; beyond one core, several EPP processes behind one Service."
        )
    elif epp and floor and floor / epp >= 0.5:
        out.append(
            f"- *Suggests*: the ext_proc transport is {floor / epp:.0%} of the EPP's cost per request, so "
            "the "
            "next factor comes from fewer or cheaper messages (skip phases no plugin needs, a cheaper "
            "gRPC stack: grpclib + uvloop was 21% cheaper in overhead-baseline.md, or several EPP "
            "processes), not from the scheduler."
        )
    chunk = ((s or {}).get("per_chunk", {}).get("epp-fd", {}) or {}).get("extproc_us_per_chunk")
    cells = [c for c in (r or {}).get("cells", []) if "failed" not in c and c["router"] == "epp-default"]
    if chunk and cells:
        c = max(cells, key=lambda c: c["rate"])
        cpu = (c.get("router_cpu_s") or {}).get("epp")
        tokens = r["workload"]["output_tokens"] if r else 0
        if cpu and c.get("ok") and tokens:
            per_req_ms = cpu / c["ok"] * 1e3
            chunks_ms = chunk * tokens / 1e3
            out.append(
                f"- *Suggests*: at ~{f(chunk, 0)} µs per response chunk, {tokens} streamed tokens cost the "
                "EPP "
                f"~{chunks_ms:.1f} ms of the {per_req_ms:.1f} ms it spends per routed request under GIE's "
                "full-duplex "
                "config; Envoy's buffered/streamed modes with mode override remove that cost when no plugin "
                "needs response bodies."
            )
    return out
