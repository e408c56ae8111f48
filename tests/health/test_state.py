"""The health state machine, table-driven: each case is a script of signals on a small pool and
the verdict it must reach (status, reason, availability, score)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from epp.explain.record import Decision, to_json
from epp.explain.table import render
from epp.health import EndpointHealth, HealthPolicy, HealthPool, Status
from epp.health.state import SCRAPE_ERROR, SCRAPE_OK, SCRAPE_REFUSED, SCRAPE_TIMEOUT
from epp.scheduling.api import ProfileTrace
from epp.testing.builders import make_endpoint

# The defaults (3 5xx, 2 gateway failures, 10 s base ejection, 150 ms hang...), a 1 s base penalty.
POLICY = HealthPolicy.model_validate({"basePenaltyTime": "1s"})


@dataclass(frozen=True)
class Ev:
    """One signal at time ``t`` to endpoint ``ep`` (``kind`` names the EndpointHealth method)."""

    t: float
    kind: str
    ep: int = 0
    status: int = 200
    value: float = 0.0  # elapsed / ttft
    queue: int = 0
    running: int = 0
    outcome: str = SCRAPE_OK
    streaming: bool = True


def scrape(t0: float, t1: float, ep: int = 0, outcome: str = SCRAPE_OK) -> list[Ev]:
    return [Ev(t0, "scrape_started", ep), Ev(t1, "scrape_ended", ep, outcome=outcome)]


def served(t: float, ep: int = 0, status: int = 200, elapsed: float = 0.02) -> list[Ev]:
    """A request routed at ``t`` whose headers came ``elapsed`` later, ended right after."""
    return [
        Ev(t, "sent", ep),
        Ev(t + elapsed, "headers", ep, status=status, value=elapsed),
        Ev(t + elapsed, "ended", ep),
    ]


def ttft(t: float, seconds: float, ep: int = 0, queue: int = 0, running: int = 0) -> list[Ev]:
    """A streamed request routed at ``t``: headers at once, first token ``seconds`` later."""
    return [
        Ev(t, "sent", ep),
        Ev(t + 0.001, "headers", ep, value=0.001),
        Ev(t + seconds, "first_byte", ep, value=seconds, queue=queue, running=running),
        Ev(t + seconds, "ended", ep),
    ]


def healthy_peers(n: int, until: float, *, latency: float = 0.05, step: float = 0.05) -> list[Ev]:
    """Endpoints 1..n scraped every ``step`` and answering with first tokens in ``latency``."""
    out: list[Ev] = []
    t = 0.0
    while t < until:
        for ep in range(1, n + 1):
            out += scrape(t, t + 0.002, ep)
            out += ttft(t, latency, ep)
        t += step
    return out


def run(events: list[Ev], peers: int = 3) -> tuple[HealthPool, list[EndpointHealth]]:
    pool = HealthPool(POLICY, refs_ttl=0.0)
    eps = [EndpointHealth(f"e{i}", pool) for i in range(peers + 1)]
    for h in eps:
        h.join()
    for ev in sorted(events, key=lambda e: e.t):  # stable: same-time events keep their order
        h = eps[ev.ep]
        match ev.kind:
            case "scrape_started":
                h.scrape_started(ev.t)
            case "scrape_ended":
                h.scrape_ended(ev.outcome, ev.t)
            case "sent":
                h.available(ev.t)  # as routing does before it picks
                h.sent(ev.t)
            case "headers":
                h.headers(ev.status, ev.value, ev.t)
            case "first_byte":
                h.first_byte(ev.value, ev.queue, ev.running, ev.streaming, ev.t)
            case "ended":
                h.ended(True, ev.t)
            case "lost":  # the stream ended without response headers
                h.ended(False, ev.t)
            case "check":
                h.available(ev.t)
            case _:
                raise AssertionError(ev.kind)
    return pool, eps


@dataclass(frozen=True)
class Case:
    events: list[Ev]
    at: float  # when the verdict is read
    status: Status
    reason: str = ""
    available: bool = True
    score: float = 1.0


# Ten times the peers' first tokens, three requests in a row, the last sent after the first came.
SLOW_SENT = (0.0, 0.1, 0.55)
SLOW_THRICE = [ev for t in SLOW_SENT for ev in ttft(t, 0.5)]
HANG_LOAD = [ev for i in range(10) for ev in served(i * 0.02)]  # steady traffic before the fault

CASES = {
    "refused-scrape-is-unreachable": Case(
        scrape(0.0, 0.001, outcome=SCRAPE_REFUSED), 0.01, Status.UNREACHABLE, "connection-refused", False
    ),
    "a-scrape-that-succeeds-again-brings-it-back": Case(
        [*scrape(0.0, 0.001, outcome=SCRAPE_REFUSED), *scrape(0.05, 0.051)],
        0.06,
        Status.HEALTHY,
        "scrape-succeeded",
    ),
    "metrics-errors-are-not-a-health-signal": Case(
        [ev for i in range(5) for ev in scrape(i * 0.05, i * 0.05 + 0.001, outcome=SCRAPE_ERROR)],
        0.3,
        Status.HEALTHY,
    ),
    "three-5xx-in-a-row-eject": Case(
        [ev for i in range(3) for ev in served(i * 0.01, status=500)],
        0.1,
        Status.EJECTED,
        "consecutive-5xx",
        False,
    ),
    "a-success-resets-the-5xx-streak": Case(
        [*served(0.0, status=500), *served(0.01, status=500), *served(0.02), *served(0.03, status=500)],
        0.1,
        Status.HEALTHY,
    ),
    "two-gateway-failures-eject": Case(
        [*served(0.0, status=503), *served(0.01, status=504)],
        0.1,
        Status.EJECTED,
        "consecutive-gateway-failure",
        False,
    ),
    "4xx-is-the-clients-fault": Case(
        [ev for i in range(10) for ev in served(i * 0.01, status=429)], 0.2, Status.HEALTHY
    ),
    "ejection-expires-into-probing": Case(
        [ev for i in range(3) for ev in served(i * 0.01, status=500)],
        10.1,
        Status.PROBING,
        "ejection-expired",
    ),
    "a-probe-in-flight-admits-no-second-request": Case(
        [*(ev for i in range(3) for ev in served(i * 0.01, status=500)), Ev(10.1, "sent")],
        10.2,
        Status.PROBING,
        "ejection-expired",
        False,
    ),
    "a-successful-probe-heals": Case(
        [*(ev for i in range(3) for ev in served(i * 0.01, status=500)), *served(10.1)],
        10.2,
        Status.HEALTHY,
        "probe-succeeded",
    ),
    "a-failed-probe-ejects-again": Case(
        [*(ev for i in range(3) for ev in served(i * 0.01, status=500)), *served(10.1, status=500)],
        10.2,
        Status.EJECTED,
        "consecutive-5xx",
        False,
    ),
    "hang-scrape-and-requests-stuck": Case(
        [*healthy_peers(3, 0.5), *HANG_LOAD, Ev(0.2, "scrape_started"), Ev(0.21, "sent"), Ev(0.40, "check")],
        0.41,
        Status.EJECTED,
        "scrape-hang",
        False,
    ),
    "hang-lifted-when-a-scrape-completes": Case(
        [
            *healthy_peers(3, 0.5),
            Ev(0.2, "scrape_started"),
            Ev(0.21, "sent"),
            Ev(0.40, "check"),
            Ev(0.45, "scrape_ended"),
        ],
        0.46,
        Status.PROBING,
        "scrape-succeeded",
    ),
    "busy-slow-scrapes-that-complete-never-eject": Case(
        [
            *healthy_peers(3, 1.0),
            *(ev for i in range(10) for ev in scrape(i * 0.1, i * 0.1 + 0.09)),
            *(ev for i in range(50) for ev in served(i * 0.02, elapsed=0.3)),
        ],
        1.2,
        Status.HEALTHY,
    ),
    "metrics-stall-while-answering-is-not-a-hang": Case(
        [
            *healthy_peers(3, 1.0),
            Ev(0.0, "scrape_started"),
            *(ev for i in range(50) for ev in served(i * 0.02)),
        ],
        1.0,
        Status.HEALTHY,
    ),
    "our-own-stall-ejects-nobody": Case(  # every scrape overdue at once: the EPP's loop was blocked
        [*(Ev(0.0, "scrape_started", ep) for ep in range(4)), Ev(0.01, "sent"), Ev(0.5, "check")],
        0.5,
        Status.HEALTHY,
    ),
    "a-scrape-timeout-alone-is-counted-not-ejected": Case(
        scrape(0.0, 1.0, outcome=SCRAPE_TIMEOUT), 1.01, Status.HEALTHY
    ),
    "inference-stall-no-headers-long-after-peers": Case(
        [
            *healthy_peers(3, 1.0),
            *(ev for i in range(20) for ev in scrape(i * 0.05, i * 0.05 + 0.002)),
            Ev(0.1, "sent"),
        ],
        0.9,
        Status.EJECTED,
        "no-response-headers",
        False,
    ),
    "no-headers-without-peer-reference-waits": Case(
        [*(ev for i in range(20) for ev in scrape(i * 0.05, i * 0.05 + 0.002)), Ev(0.1, "sent")],
        0.9,
        Status.HEALTHY,
    ),
    "ttft-outlier-is-penalised-not-ejected": Case(
        [*healthy_peers(3, 0.5), *SLOW_THRICE],
        1.1,
        Status.DEGRADED,
        "latency-outlier",
        True,
        0.0,
    ),
    "penalty-expires-into-a-probe": Case(
        [*healthy_peers(3, 0.5), *SLOW_THRICE], 2.2, Status.PROBING, "penalty-expired"
    ),
    "a-fast-probe-lifts-the-penalty": Case(
        [*healthy_peers(3, 2.5), *SLOW_THRICE, *ttft(2.2, 0.05)],
        2.3,
        Status.HEALTHY,
        "probe-succeeded",
    ),
    "a-slow-probe-penalises-again": Case(
        [*healthy_peers(3, 2.5), *SLOW_THRICE, *ttft(2.2, 0.5)],
        2.8,
        Status.DEGRADED,
        "latency-outlier",
        True,
        0.0,
    ),
    "far-busier-than-its-peers-is-not-judged": Case(
        [*healthy_peers(3, 0.5), *(ev for t in SLOW_SENT for ev in ttft(t, 0.5, running=120))],
        1.1,
        Status.HEALTHY,
    ),
    "a-little-busier-and-10x-slower-is-judged": Case(
        [*healthy_peers(3, 0.5), *(ev for t in SLOW_SENT for ev in ttft(t, 0.5, running=3))],
        1.1,
        Status.DEGRADED,
        "latency-outlier",
        True,
        0.0,
    ),
    "slow-because-queued-is-not-an-outlier": Case(
        [*healthy_peers(3, 0.5), *(ev for t in SLOW_SENT for ev in ttft(t, 0.5, queue=9))],
        1.1,
        Status.HEALTHY,
    ),
    # A stalled moment of the replica's process: the requests in flight there are slow, ten times
    # the peers' (the average triples at once), and the next one is not.
    "a-stalled-moment-is-not-an-outlier": Case(
        [*healthy_peers(3, 0.5), *ttft(0.0, 0.05), *ttft(0.05, 0.5), *ttft(0.06, 0.5), *ttft(0.6, 0.05)],
        0.7,
        Status.HEALTHY,
    ),
    # A stall of a moment delays every request in flight there: they all come late together,
    # three slow samples in a row, but none of them from a request sent after the first came.
    "a-stall-that-delays-the-requests-in-flight-together": Case(
        [*healthy_peers(3, 0.7), *ttft(0.0, 0.5), *ttft(0.02, 0.48), *ttft(0.04, 0.46), *ttft(0.55, 0.05)],
        0.65,
        Status.HEALTHY,
    ),
    "a-fast-sample-breaks-the-streak": Case(
        [*healthy_peers(3, 0.7), *ttft(0.0, 0.5), *ttft(0.05, 0.5), *ttft(0.55, 0.05), *ttft(0.6, 0.5)],
        1.15,
        Status.HEALTHY,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_health_state_machine(case: Case) -> None:
    _, eps = run(case.events)
    h = eps[0]
    assert h.available(case.at) is case.available
    assert (h.status, h.reason) == (case.status, case.reason or h.reason)
    if case.reason == "" and case.status is Status.HEALTHY:
        assert h.reason in ("", "probe-succeeded", "scrape-succeeded")
    assert h.score() == case.score
    for peer in eps[1:]:
        assert peer.status is Status.HEALTHY, f"{peer.name} is {peer.status.name} ({peer.reason})"


def test_ejection_backoff_doubles_up_to_max_ejection_time() -> None:
    pool = HealthPool(HealthPolicy.model_validate({"baseEjectionTime": 1.0, "maxEjectionTime": 5.0}))
    h = EndpointHealth("e", pool)
    durations = []
    t = 0.0
    for _ in range(5):
        for _ in range(3):
            h.available(t)
            h.sent(t)
            h.headers(500, 0.01, t)
        durations.append(h.ejected_until - t)
        t = h.ejected_until  # expired: the next 500 is its probe failing
    assert durations == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(("percent", "ejected"), [(50.0, 2), (10.0, 1), (100.0, 4)])
def test_never_more_than_max_ejection_percent(percent: float, ejected: int) -> None:
    """Over the budget an endpoint is penalised instead, and at least one may always go (Envoy)."""
    pool = HealthPool(HealthPolicy.model_validate({"maxEjectionPercent": percent}))
    eps = [EndpointHealth(f"e{i}", pool) for i in range(4)]
    for h in eps:
        h.join()
        for _ in range(3):
            h.headers(500, 0.01, 0.0)
    assert sum(h.status is Status.EJECTED for h in eps) == ejected
    over = [h for h in eps if h.status is not Status.EJECTED]
    assert all(h.status is Status.DEGRADED and h.reason.startswith("max-ejection-percent") for h in over)
    assert all(h.available(0.1) and h.score() == 0.0 for h in over)


def test_a_departed_peer_frees_the_budget() -> None:
    pool = HealthPool(HealthPolicy.model_validate({"maxEjectionPercent": 10.0}))
    a, b = EndpointHealth("a", pool), EndpointHealth("b", pool)
    a.join()
    b.join()
    for h in (a, b):
        for _ in range(3):
            h.headers(500, 0.01, 0.0)
    assert (a.status, b.status) == (Status.EJECTED, Status.DEGRADED)
    a.leave()
    b.headers(500, 0.01, 0.1)
    assert b.debug_state(0.1)["status"] == "degraded"  # a streak restarts after a verdict
    for _ in range(3):
        b.headers(500, 0.01, 0.2)
    assert b.status is Status.EJECTED


def test_policy_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="maxEjectionPercent"):
        HealthPolicy.model_validate({"maxEjectionPercent": 150})
    with pytest.raises(ValueError, match="baseEjectionTime"):
        HealthPolicy.model_validate({"baseEjectionTime": "soon"})
    with pytest.raises(ValueError, match="maxEjectionTime must not be below baseEjectionTime"):
        HealthPolicy.model_validate({"baseEjectionTime": "10s", "maxEjectionTime": "1s"})
    assert HealthPolicy.model_validate({"scrapeHangTime": "200ms"}).scrape_hang_time == pytest.approx(0.2)


def test_explain_shows_the_candidates_health() -> None:
    """``epp explain``'s table gains a health column when a candidate is not healthy."""
    a, b = make_endpoint(0), make_endpoint(1)
    for _ in range(3):
        b.health.headers(500, 0.01, 1.0)
    trace = ProfileTrace(
        profile="default",
        candidates=(a, b),
        filters=(),
        scored=(a, b),
        scorers=(("queue-scorer", 1.0),),
        contributions=((1.0, 0.5),),
        totals=(1.0, 0.5),
        picker="max-score-picker",
        picked=(a,),
    )
    d = Decision("rid", 0.0, model="m", admission="admitted", outcome="routed", destination=a.hostport)
    d.profiles = [trace]
    lines = render(to_json(d)).splitlines()
    header = next(line for line in lines if "endpoint" in line)
    assert [h.strip() for h in header.split("|")][:2] == ["endpoint", "health"]
    rows = {line.split("|")[0].strip(): [x.strip() for x in line.split("|")] for line in lines if "|" in line}
    assert rows[a.hostport][1] == "healthy" and rows[b.hostport][1] == "ejected"


def test_the_latency_reference_of_two_peers_is_the_slower() -> None:
    """A peer that routing left alone keeps the figure it had (here 6 ms, a busy replica's last);
    the reference is not the mean of that and the live peer's (10 ms): 25 ms is 3x the mean, not
    the live peer's, so it is no outlier."""
    events = [*ttft(0.0, 0.006, ep=1)]
    events += [ev for i in range(40) for ev in ttft(i * 0.05, 0.010, ep=2)]
    events += [ev for i in range(20) for ev in ttft(i * 0.1, 0.025, ep=0)]
    _, eps = run(events, peers=2)
    assert eps[0].status is Status.HEALTHY, eps[0].reason
    assert eps[0].refs[0] == pytest.approx(0.010)
