"""Explained requests through the director: the trusted header, the breakdown, the decisions ring."""

from __future__ import annotations

import random

import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.datastore.store import Datastore
from epp.director.director import Director, Pipeline
from epp.errors import EppError, PayloadTooLarge
from epp.explain.record import SCORES_HEADER, DecisionRing, parse_header
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.builders import make_endpoint
from epp.testing.plugins import build
from tests.director.test_director import JsonParser, body

HEADER = "x-epp-explain"


def director(
    *, explain_header: str = HEADER, ring: DecisionRing | None = None, emit: bool = False
) -> Director:
    ds = Datastore()
    for ep in (
        make_endpoint(0, queue=3, kv=0.5),
        make_endpoint(1, queue=0, kv=0.1),
        make_endpoint(2, queue=9),
    ):
        ds._endpoints[ep.name] = ep
    ds._snapshot = tuple(ds._endpoints.values())
    profile = SchedulerProfile(
        "default",
        filters=[],
        scorers=[(build(QueueScorer), 1.0), (build(KVCacheUtilizationScorer), 2.0)],
        picker=build(MaxScorePicker),
    )
    pipe = Pipeline(
        parser=JsonParser(),  # type: ignore[arg-type]
        scheduler=Scheduler(build(SingleProfileHandler), [profile]),
        admission=AlwaysAdmit(),
        emit_endpoint_scores=emit,
        explain_header=explain_header,
        decisions=ring,
    )
    return Director(ds, pipe, rng=random.Random(0))


async def test_trusted_header_gets_the_breakdown_in_metadata_and_response_header() -> None:
    d = director()
    lc = d.start({"x-request-id": "r1", HEADER: "true"}, {})
    assert lc.response_headers_needed  # the edge must not skip the response headers
    decision = await lc.route(body())
    assert decision.destination == make_endpoint(1).hostport
    assert decision.scores is not None and decision.breakdown is not None
    for address, parts in decision.breakdown.items():  # the final score is the sum of the parts
        assert decision.scores[address] == pytest.approx(sum(parts.values()), abs=1e-5)
        assert set(parts) == {"queue-scorer", "kv-cache-utilization-scorer"}
    added = dict(lc.response_headers({":status": "200"}, end_of_stream=False))
    rows = parse_header(added[SCORES_HEADER])
    assert rows[0][0] == decision.destination  # the pick first
    assert {a: parts for a, _, parts in rows} == {a: dict(p) for a, p in decision.breakdown.items()}
    lc.close()


@pytest.mark.parametrize("value", ["0", "false", ""])
async def test_header_saying_no_explains_nothing(value: str) -> None:
    lc = director().start({HEADER: value}, {})
    decision = await lc.route(body())
    assert decision.scores is None and decision.breakdown is None
    assert lc.response_headers({":status": "200"}, end_of_stream=False) == []


async def test_without_the_flag_the_client_header_does_nothing() -> None:
    lc = director(explain_header="").start({HEADER: "true"}, {})
    assert not lc.request.explain and not lc.response_headers_needed
    decision = await lc.route(body())
    assert decision.scores is None and decision.breakdown is None
    assert lc.response_headers({":status": "200"}, end_of_stream=False) == []


async def test_emit_flag_puts_the_breakdown_in_metadata_but_adds_no_response_header() -> None:
    lc = director(explain_header="", emit=True).start({}, {})
    decision = await lc.route(body())
    assert decision.scores is not None and decision.breakdown is not None
    assert lc.response_headers({":status": "200"}, end_of_stream=False) == []


async def test_decisions_ring_records_routed_and_rejected_requests() -> None:
    ring = DecisionRing(8)
    d = director(explain_header="", ring=ring)
    lc = d.start({"x-request-id": "ok"}, {})
    decision = await lc.route(body())
    assert decision.scores is None  # recording does not put anything on the wire
    lc.close()
    rec = ring.get("ok")
    assert rec is not None
    assert (rec.outcome, rec.admission, rec.destination, rec.model) == (
        "routed",
        "admitted",
        decision.destination,
        "my-model",
    )
    assert len(rec.candidates) == 3 and [t.profile for t in rec.profiles] == ["default"]
    assert list(rec.stages) == ["body", "parse", "admission", "schedule", "pick"]

    bad = d.start({"x-request-id": "bad"}, {})
    with pytest.raises(EppError):
        await bad.route(b"{")
    bad.close()
    rec = ring.get("bad")
    assert rec is not None and (rec.outcome, rec.reason) == ("rejected", "rejected-bad-request")

    never = d.start({"x-request-id": "big"}, {})  # the edge refused the body before routing
    never.close(PayloadTooLarge("too big"))
    rec = ring.get("big")
    assert rec is not None and rec.reason == "rejected-body-too-large"
    assert [x.request_id for x in ring.latest(10)] == ["big", "bad", "ok"]


async def test_after_a_config_swap_the_new_pipeline_decides_what_is_explained() -> None:
    from dataclasses import replace

    ring = DecisionRing(4)
    d = director(explain_header="")
    old = d.start({HEADER: "1", "x-request-id": "before"}, {})
    d.swap(replace(d.pipeline, explain_header=HEADER, decisions=ring))
    new = d.start({HEADER: "1", "x-request-id": "after"}, {})
    assert (await new.route(body())).breakdown is not None
    assert (await old.route(body())).breakdown is None  # started on the old pipeline
    new.close()
    old.close()
    assert ring.get("after") is not None and ring.get("before") is None
