"""The decision ring (bounded, indexed by request id), the breakdown's formats and the JSON form."""

from __future__ import annotations

from epp.explain.record import (
    Decision,
    DecisionRing,
    breakdown,
    header_value,
    parse_header,
    primary_trace,
    to_json,
)
from epp.scheduling.api import ProfileTrace
from epp.testing.builders import make_endpoint


def _decision(rid: str) -> Decision:
    return Decision(rid, 0.0)


def test_ring_keeps_the_last_n_and_finds_them_by_id() -> None:
    ring = DecisionRing(3)
    for i in range(5):
        ring.add(_decision(f"r{i}"))
    assert len(ring) == 3
    assert ring.get("r0") is None and ring.get("r1") is None  # evicted, and forgotten by the index
    assert [d.request_id for d in ring.latest(10)] == ["r4", "r3", "r2"]
    assert [d.request_id for d in ring.latest(2)] == ["r4", "r3"]
    assert ring.latest(0) == []
    found = ring.get("r3")
    assert found is not None and found.request_id == "r3"


def test_ring_index_survives_eviction_of_an_older_decision_with_the_same_id() -> None:
    ring = DecisionRing(2)
    first, second = _decision("same"), _decision("same")
    ring.add(first)
    ring.add(second)
    ring.add(_decision("other"))  # evicts ``first``; the index must still point at ``second``
    assert ring.get("same") is second
    ring.add(_decision("third"))  # evicts ``second``
    assert ring.get("same") is None


def test_ring_query_by_id_and_by_limit() -> None:
    ring = DecisionRing(4)
    for i in range(3):
        ring.add(_decision(f"r{i}"))
    assert [d["requestId"] for d in ring.query("r1")["decisions"]] == ["r1"]
    assert ring.query("nope")["decisions"] == []
    assert [d["requestId"] for d in ring.query(limit=2)["decisions"]] == ["r2", "r1"]
    assert ring.query()["size"] == 4


def _trace() -> ProfileTrace:
    a, b, c = make_endpoint(0), make_endpoint(1), make_endpoint(2)
    return ProfileTrace(
        profile="default",
        candidates=(a, b, c),
        filters=(("subset", (a, b)),),
        scorers=(("queue-scorer", 1.0), ("kv", 2.0)),
        scored=(a, b),
        contributions=((0.25, 1.0), (1.5, 0.2)),
        totals=(1.75, 1.2),
        picker="max-score-picker",
        picked=(a,),
    )


def test_breakdown_and_header_round_trip() -> None:
    t = _trace()
    a, b = t.scored
    assert breakdown(t) == {
        a.hostport: {"queue-scorer": 0.25, "kv": 1.5},
        b.hostport: {"queue-scorer": 1.0, "kv": 0.2},
    }
    value = header_value(t)
    assert value.split(", ")[0].startswith(a.hostport + ";total=1.75;")  # the pick comes first
    assert parse_header(value) == [
        (a.hostport, 1.75, {"queue-scorer": 0.25, "kv": 1.5}),
        (b.hostport, 1.2, {"queue-scorer": 1.0, "kv": 0.2}),
    ]


def test_header_puts_picked_first_then_best_total() -> None:
    a, b, c = make_endpoint(0), make_endpoint(1), make_endpoint(2)
    t = ProfileTrace(
        "p", (a, b, c), (), (("s", 1.0),), (a, b, c), ((0.1, 0.9, 0.5),), (0.1, 0.9, 0.5), "x", (a,)
    )
    assert [addr for addr, _, _ in parse_header(header_value(t))] == [a.hostport, b.hostport, c.hostport]


def test_primary_trace_is_the_last_successful_run_of_the_primary_profile() -> None:
    ok = _trace()
    failed = ProfileTrace("default", ok.candidates, (), error="no endpoints")
    other = ProfileTrace("prefill", ok.candidates, ())
    assert primary_trace([ok, other, failed], "default") is ok
    assert primary_trace([other], "default") is None


def test_to_json_lists_filters_scores_and_pick() -> None:
    t = _trace()
    d = Decision("r1", 12.0, model="m", candidates=t.candidates, profiles=[t], outcome="routed")
    d.stages["parse"] = 1500
    j = to_json(d)
    [run] = j["profiles"]
    assert run["filters"] == [{"name": "subset", "kept": [ep.hostport for ep in t.scored]}]
    assert [e["picked"] for e in run["endpoints"]] == [True, False]
    assert run["endpoints"][0]["scores"] == {"queue-scorer": 0.25, "kv": 1.5}
    assert j["stagesMicros"] == {"parse": 1.5}
    assert j["outcome"] == "routed"


def test_mark_times_each_stage_since_the_previous_mark() -> None:
    d = Decision("r", 0.0)
    d.mark("parse")
    d.mark("schedule")
    assert list(d.stages) == ["parse", "schedule"]
    assert all(v >= 0 for v in d.stages.values())
