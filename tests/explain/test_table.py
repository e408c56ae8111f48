"""The decision table: a row per candidate, a column per filter and per weighted scorer."""

from __future__ import annotations

from epp.explain.record import Decision, to_json
from epp.explain.table import DROPPED, KEPT, PICKED, SKIPPED, render
from epp.scheduling.api import ProfileTrace
from epp.testing.builders import make_endpoint


def test_table_shows_filters_scores_total_and_pick() -> None:
    a, b, c = make_endpoint(0), make_endpoint(1), make_endpoint(2)
    trace = ProfileTrace(
        profile="default",
        candidates=(a, b, c),
        filters=(("first", (a, b)), ("second", (a,))),
        scorers=(("queue-scorer", 2.0),),
        scored=(a,),
        contributions=((1.5,),),
        totals=(1.5,),
        picker="max-score-picker",
        picked=(a,),
    )
    d = Decision("rid-1", 0.0, model="m", admission="admitted", outcome="routed", destination=a.hostport)
    d.profiles = [trace]
    d.primary_profile = "default"
    text = render(to_json(d))
    lines = text.splitlines()
    header = next(line for line in lines if "endpoint" in line)
    assert [h.strip() for h in header.split("|")] == [
        "endpoint",
        "first",
        "second",
        "queue-scorer x2",
        "total",
        "pick",
    ]
    rows = {line.split("|")[0].strip(): [x.strip() for x in line.split("|")] for line in lines if "|" in line}
    assert rows[a.hostport][1:] == [KEPT, KEPT, "1.5000", "1.5000", PICKED]
    assert rows[b.hostport][1:3] == [KEPT, DROPPED]
    assert rows[c.hostport][1:3] == [DROPPED, SKIPPED]
    assert "rid-1" in lines[0] and "admitted" in lines[1] and a.hostport in lines[1]


def test_rejected_decision_says_why() -> None:
    d = Decision(
        "r", 0.0, admission="rejected", outcome="rejected", reason="rejected-saturated", error="boom"
    )
    text = render(to_json(d))
    assert "rejected-saturated" in text and "admission: rejected" in text and "error: boom" in text
