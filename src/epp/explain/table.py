"""A decision as a plain-text table: one row per candidate, one column per filter and per scorer.

Works on the JSON form of a decision (``record.to_json``), so the same renderer serves
``epp explain`` and anything fetched from ``/debug/decisions``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KEPT, DROPPED, SKIPPED = "kept", "dropped", "-"
PICKED = "<- picked"


def render(decision: Mapping[str, Any]) -> str:
    """The decision's summary lines, then a table per profile run, then the stage timings."""
    d = decision
    model = d.get("model") or "-"
    target = d.get("targetModel") or model
    lines = [
        f"request {d.get('requestId', '')}  model {model}" + (f" -> {target}" if target != model else ""),
        f"admission: {d.get('admission') or 'not reached'}   outcome: {d.get('outcome', '')}"
        + (f" -> {d['destination']}" if d.get("destination") else "")
        + (f"   reason: {d['reason']}" if d.get("reason") else ""),
    ]
    if d.get("error"):
        lines.append(f"error: {d['error']}")
    pd = d.get("disagg")
    if pd:
        lines.append(
            f"disaggregation: {pd['decisionType']} ({pd['reason']})"
            + (f", prefill -> {pd['prefill']}" if pd.get("prefill") else "")
        )
    for run in d.get("profiles", ()):
        lines.append("")
        primary = "  (primary)" if run.get("profile") == d.get("primaryProfile") else ""
        picker = f"  picker {run['picker']}" if run.get("picker") else ""
        lines.append(f"profile {run.get('profile', '')}{primary}{picker}")
        lines.extend(_table(run))
        if run.get("error"):
            lines.append(f"  {run['error']}")
    stages = d.get("stagesMicros") or {}
    if stages:
        lines.append("")
        lines.append("stages (us): " + "  ".join(f"{k} {v:g}" for k, v in stages.items()))
    return "\n".join(lines)


def _table(run: Mapping[str, Any]) -> list[str]:
    filters: Sequence[Mapping[str, Any]] = run.get("filters", ())
    scorers: Sequence[Mapping[str, Any]] = run.get("scorers", ())
    scored = {e["address"]: e for e in run.get("endpoints", ())}
    health: Mapping[str, str] = run.get("health") or {}  # only when some candidate is not healthy
    header = ["endpoint", *(["health"] if health else [])]
    header += [f["name"] for f in filters]
    header += [f"{s['name']} x{s['weight']:g}" for s in scorers]
    header += ["total", "pick"]
    rows = []
    for address in run.get("candidates", ()):
        row = [address, *([health.get(address, "healthy")] if health else [])]
        alive = True
        for f in filters:
            if not alive:
                row.append(SKIPPED)
            elif address in f["kept"]:
                row.append(KEPT)
            else:
                row.append(DROPPED)
                alive = False
        e = scored.get(address)
        if e is None:
            row += [""] * len(scorers) + ["", ""]
        else:
            row += [_num(e["scores"].get(s["name"], 0.0)) for s in scorers]
            row += [_num(e["total"]), PICKED if e.get("picked") else ""]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  " + " | ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  " + "-+-".join("-" * w for w in widths))
    out.extend("  " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return out


def _num(x: float) -> str:
    return f"{x:.4f}"
