"""The decision record, the ring of the last N decisions, and the per-scorer breakdown's formats.

Nothing here runs for a request that is not explained: the director makes a ``Decision``
only when ``--decisions-buffer-size`` is set, and the scheduler keeps ``ProfileTrace`` s
only for a request whose ``explain`` is true.  A decision keeps references (endpoints,
traces) and is turned into JSON only when someone asks (``to_json``), so recording costs
per stage two observer calls, an attribute write or two and one ``perf_counter_ns``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Final

from epp.datalayer.api import Endpoint
from epp.scheduling.api import DisaggDecision, ProfileTrace

# envoy.lb keys: llm-d-router's final scores, and our per-scorer breakdown beside them.
SCORES_KEY: Final = "x-gateway-destination-endpoint-scores"
BREAKDOWN_KEY: Final = "x-gateway-destination-endpoint-score-breakdown"
# The response header an explained request gets (same name as the metadata key it expands).
SCORES_HEADER: Final = SCORES_KEY
_DIGITS: Final = 6

# Decision.outcome values.
ROUTED: Final = "routed"
REJECTED: Final = "rejected"


@dataclass(slots=True, eq=False)
class Decision:
    """One request's routing decision, filled in as routing proceeds (director/observer.py)."""

    request_id: str
    wall_time: float  # time.time() when the request headers arrived
    model: str = ""
    target_model: str = ""
    candidates: Sequence[Endpoint] = ()
    admission: str = ""  # "admitted", or "rejected" when admission (flow control, admit plugins) said no
    profiles: Sequence[ProfileTrace] = ()  # every profile run, in order (P/D: decode and prefill)
    primary_profile: str = ""
    disagg: DisaggDecision | None = None  # what a P/D profile handler decided (prefill used or not)
    destination: str = ""
    outcome: str = ""  # ROUTED or REJECTED
    reason: str = ""  # machine-readable rejection reason (x-llm-d-request-dropped-reason)
    error: str = ""
    stages: dict[str, int] = field(default_factory=dict)  # stage -> nanoseconds
    _marked_at: int = field(default_factory=perf_counter_ns)

    def mark(self, stage: str) -> None:
        """The stage that just ended took the time since the previous mark (or the start)."""
        now = perf_counter_ns()
        self.stages[stage] = now - self._marked_at
        self._marked_at = now


class DecisionRing:
    """The last ``size`` decisions, indexed by request id; O(1) to add and to look up.

    A deque with ``maxlen`` drops the oldest on append; the index forgets it then unless a
    newer decision with the same request id took its slot.  Single-threaded (the event loop).
    """

    __slots__ = ("_index", "_ring", "size")

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("the decisions buffer needs a positive size")
        self.size = size
        self._ring: deque[Decision] = deque()
        self._index: dict[str, Decision] = {}

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, decision: Decision) -> None:
        ring = self._ring
        if len(ring) >= self.size:
            old = ring.popleft()
            if self._index.get(old.request_id) is old:
                del self._index[old.request_id]
        ring.append(decision)
        self._index[decision.request_id] = decision

    def get(self, request_id: str) -> Decision | None:
        return self._index.get(request_id)

    def latest(self, limit: int) -> list[Decision]:
        """The newest ``limit`` decisions, newest first."""
        ring = self._ring
        n = min(max(limit, 0), len(ring))
        return [ring[-1 - i] for i in range(n)]

    def query(self, request_id: str = "", limit: int = 20) -> dict[str, Any]:
        """``/debug/decisions``: one request's decision by id, else the newest ``limit``."""
        if request_id:
            found = self.get(request_id)
            return {"size": self.size, "decisions": [to_json(found)] if found is not None else []}
        return {"size": self.size, "decisions": [to_json(d) for d in self.latest(limit)]}


def primary_trace(traces: Sequence[ProfileTrace], primary: str) -> ProfileTrace | None:
    """The last successful run of the primary profile (a handler may run a profile twice)."""
    for t in reversed(traces):
        if t.profile == primary and not t.error:
            return t
    return None


def breakdown(trace: ProfileTrace) -> dict[str, dict[str, float]]:
    """``{"ip:port": {"<scorer name>": weighted score, ...}}`` for every scored endpoint."""
    names = [name for name, _ in trace.scorers]
    return {
        ep.hostport: {name: round(c[i], _DIGITS) for name, c in zip(names, trace.contributions, strict=True)}
        for i, ep in enumerate(trace.scored)
    }


def header_value(trace: ProfileTrace) -> str:
    """The response header: every scored endpoint, best total first, picked ones ahead of the rest.

    ``ip:port;total=0.91;<scorer>=0.5;<scorer>=0.41, ip:port;total=...`` (RFC 8941-style
    parameters; scorer names are the config's plugin names, in profile order).
    """
    picked = {ep: i for i, ep in enumerate(trace.picked)}
    order = sorted(
        range(len(trace.scored)),
        key=lambda i: (picked.get(trace.scored[i], len(picked)), -trace.totals[i]),
    )
    names = [name for name, _ in trace.scorers]
    items = []
    for i in order:
        parts = [trace.scored[i].hostport, f"total={_decimal(trace.totals[i])}"]
        parts.extend(f"{n}={_decimal(c[i])}" for n, c in zip(names, trace.contributions, strict=True))
        items.append(";".join(parts))
    return ", ".join(items)


def _decimal(x: float) -> str:
    """Shortest decimal of ``x`` rounded to six digits ("0.5", "1", "0.333333")."""
    s = f"{x:.{_DIGITS}f}".rstrip("0").rstrip(".")
    return s if s not in ("", "-0") else "0"


def parse_header(value: str) -> list[tuple[str, float, dict[str, float]]]:
    """The response header back into ``[(ip:port, total, {scorer: weighted score})]``, in order."""
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        address, *params = item.split(";")
        kv = dict(p.split("=", 1) for p in params)
        total = float(kv.pop("total"))
        out.append((address, total, {k: float(v) for k, v in kv.items()}))
    return out


def trace_json(t: ProfileTrace) -> dict[str, Any]:
    """One profile run as JSON: filters' survivors, and per endpoint its weighted scores and total."""
    names = [name for name, _ in t.scorers]
    picked = {ep.hostport for ep in t.picked}
    return {
        "profile": t.profile,
        "candidates": [ep.hostport for ep in t.candidates],
        "filters": [{"name": name, "kept": [ep.hostport for ep in kept]} for name, kept in t.filters],
        "scorers": [{"name": name, "weight": w} for name, w in t.scorers],
        "endpoints": [
            {
                "address": ep.hostport,
                "name": ep.name,
                "scores": {n: round(c[i], _DIGITS) for n, c in zip(names, t.contributions, strict=True)},
                "total": round(t.totals[i], _DIGITS),
                "picked": ep.hostport in picked,
            }
            for i, ep in enumerate(t.scored)
        ],
        "picker": t.picker,
        "picked": [ep.hostport for ep in t.picked],
        # Candidates not healthy (epp.health) when the record is rendered, by address.
        "health": {ep.hostport: ep.health.status.name.lower() for ep in t.candidates if ep.health.status},
        "error": t.error,
    }


def to_json(d: Decision) -> dict[str, Any]:
    """A decision as the JSON ``/debug/decisions`` and ``epp explain --json`` print."""
    return {
        "requestId": d.request_id,
        "time": d.wall_time,
        "model": d.model,
        "targetModel": d.target_model,
        "candidates": [ep.hostport for ep in d.candidates],
        "admission": d.admission,
        "profiles": [trace_json(t) for t in d.profiles],
        "primaryProfile": d.primary_profile,
        "disagg": None
        if d.disagg is None
        else {
            "decisionType": d.disagg.decision_type,
            "reason": d.disagg.reason,
            "prefill": d.disagg.prefill,
            "declinedProfile": d.disagg.declined_profile,
        },
        "destination": d.destination,
        "outcome": d.outcome,
        "reason": d.reason,
        "error": d.error,
        "stagesMicros": {k: round(v / 1000, 1) for k, v in d.stages.items()},
    }
