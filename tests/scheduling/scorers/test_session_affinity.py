"""session-affinity-scorer: 1.0 on the session's endpoint; new sessions spread; saturation lets go."""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.api import Endpoint
from epp.flowcontrol.detectors.utilization import UtilizationDetector
from epp.plugin.state import CycleState
from epp.request import AGENT_IDENTITY, InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.sessions import encode_token
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build


def turn(
    s: SessionAffinityScorer, req: InferenceRequest, eps: Sequence[Endpoint], pick: Endpoint | None = None
) -> tuple[list[float], ResponseInfo]:
    """Score, pick the best (or ``pick``), run the hooks."""
    state = CycleState()
    scores = list(s.score(state, req, eps))
    picked = pick or eps[scores.index(max(scores))]
    s.pre_request(state, req, SchedulingResult({"default": ProfileRunResult((picked,))}, "default"))
    resp = ResponseInfo(request_id=req.request_id)
    s.response_header(state, req, resp, picked)
    return scores, resp


def req(session: str = "") -> InferenceRequest:
    return make_request(headers={"x-session-token": session} if session else {})


def stateful(handle: FakeHandle | None = None) -> SessionAffinityScorer:
    s: SessionAffinityScorer = build(SessionAffinityScorer, handle=handle, algorithm="session_id_header")
    return s


def test_new_sessions_spread_over_the_least_bound_endpoints_then_stick() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    s = stateful()
    first = []
    for i in range(3):
        scores, resp = turn(s, req(f"c{i}"), eps)
        assert sorted(scores) == [0.0, 0.0, 1.0]
        assert resp.headers == {}
        first.append(scores.index(1.0))
    assert sorted(first) == [0, 1, 2]  # one session per endpoint
    for i in range(3):
        scores, _ = turn(s, req(f"c{i}"), eps)
        assert scores.index(1.0) == first[i]
    assert turn(s, req(), eps)[0] == [0.0, 0.0, 0.0]


def test_picked_elsewhere_rebinds_and_gone_endpoint_moves_the_session() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    s = stateful()
    turn(s, req("c"), eps, pick=eps[1])
    assert turn(s, req("c"), eps, pick=eps[2])[0] == [0.0, 1.0, 0.0]  # outweighed elsewhere
    assert turn(s, req("c"), eps)[0] == [0.0, 0.0, 1.0]  # follows the newest context
    rest = eps[:2]
    turn(s, req("c"), rest, pick=eps[0])
    assert turn(s, req("c"), rest)[0] == [1.0, 0.0]


def test_saturated_session_endpoint_releases_the_turn_to_the_other_scorers() -> None:
    """While the session's endpoint is saturated every candidate scores 0.0 (the prefix and load
    scorers place the turn; the session is not pushed to the least-bound endpoint); the session
    follows wherever that turn went, and its endpoint scores 1.0 again once not saturated."""
    handle = FakeHandle([build(UtilizationDetector, kvCacheUtilThreshold=0.8)])
    s = stateful(handle)
    turn(s, req("c"), [make_endpoint(0), make_endpoint(1)], pick=make_endpoint(0))
    full = [make_endpoint(0, kv=0.9), make_endpoint(1)]
    scores, _ = turn(s, req("c"), full, pick=full[0])  # the other scorers kept it on 0
    assert scores == [0.0, 0.0]
    assert turn(s, req("c"), [make_endpoint(0), make_endpoint(1)])[0] == [1.0, 0.0]
    scores, _ = turn(s, req("c"), full, pick=full[1])  # this time they moved it
    assert scores == [0.0, 0.0]
    assert turn(s, req("c"), [make_endpoint(0), make_endpoint(1)])[0] == [0.0, 1.0]


def test_saturated_session_endpoint_is_not_offered_as_the_least_bound_one() -> None:
    """A saturated endpoint is no reason to re-place its session on the least-bound one: with
    endpoint 0 saturated, its session c0 scores nothing anywhere, however bound the others are."""
    handle = FakeHandle([build(UtilizationDetector, queueDepthThreshold=5)])
    s = stateful(handle)
    eps = [make_endpoint(i) for i in range(3)]
    for i, ep in enumerate(eps):  # one session each: every endpoint is equally bound
        turn(s, req(f"c{i}"), eps, pick=ep)
    turn(s, req("d"), eps, pick=eps[1])  # endpoint 1 now holds two, 0 and 2 one each
    busy = [make_endpoint(0, queue=9), make_endpoint(1), make_endpoint(2)]
    for _ in range(4):
        assert s.score(CycleState(), req("c0"), busy) == [0.0, 0.0, 0.0]


def test_encoded_endpoint_header() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    s: SessionAffinityScorer = build(SessionAffinityScorer)
    scores, resp = turn(s, req(), eps, pick=eps[2])
    assert scores == [0.0, 0.0, 0.0]
    assert resp.headers["x-session-token"] == encode_token(eps[2])
    assert turn(s, req(resp.headers["x-session-token"]), eps)[0] == [0.0, 0.0, 1.0]


def test_a_new_session_is_not_placed_on_a_saturated_endpoint() -> None:
    """Endpoint 0 is bound by the fewest sessions but saturated: a new session scores 1.0 on the
    least-bound of the others; with every endpoint saturated, on the least-bound of all."""
    handle = FakeHandle([build(UtilizationDetector, queueDepthThreshold=5)])
    s = stateful(handle)
    eps = [make_endpoint(i) for i in range(3)]
    turn(s, req("a"), eps, pick=eps[1])
    turn(s, req("b"), eps, pick=eps[2])
    turn(s, req("c"), eps, pick=eps[2])
    busy = [make_endpoint(0, queue=9), make_endpoint(1), make_endpoint(2)]
    assert s.score(CycleState(), req("new"), busy) == [0.0, 1.0, 0.0]
    every = [make_endpoint(i, queue=9) for i in range(3)]
    assert s.score(CycleState(), req("new2"), every) == [1.0, 0.0, 0.0]


def test_llm_d_v0_10_parameters_configure_the_scorer_like_the_filter() -> None:
    """v0.10 moved the scorer to the filter's ``strategy`` / ``sessionIdConfig`` form."""
    eps = [make_endpoint(i) for i in range(3)]
    s: SessionAffinityScorer = build(
        SessionAffinityScorer,
        strategy="session_id",
        sessionIdConfig={"sources": [{"header": "x-conversation"}], "evictionTtlSeconds": 60},
    )
    assert s.affinity.stateful and s.affinity.headers == ("x-conversation",) and s.affinity.bindings.ttl == 60
    first = make_request(headers={"x-conversation": "c1"})
    turn(s, first, eps, pick=eps[1])
    assert turn(s, make_request(headers={"x-conversation": "c1"}), eps)[0] == [0.0, 1.0, 0.0]
    token: SessionAffinityScorer = build(
        SessionAffinityScorer,
        strategy="encoded_endpoint_header",
        encodedEndpointHeaderConfig={"header": "x-t"},
    )
    _, resp = turn(token, make_request(), eps, pick=eps[0])
    assert resp.headers["x-t"] == encode_token(eps[0])


def test_the_agent_identity_attribute_is_a_session_id_source() -> None:
    """``sessionIdConfig.sources[].attribute: agent-identity``: the scorer reads the identity the
    agent-identity plugin put in the cycle state, so an agent's turns return to one endpoint."""
    eps = [make_endpoint(i) for i in range(3)]
    s: SessionAffinityScorer = build(
        SessionAffinityScorer,
        strategy="session_id",
        sessionIdConfig={"sources": [{"attribute": "agent-identity"}]},
    )

    def scored(identity: str | None, pick: Endpoint | None = None) -> list[float]:
        state, request = CycleState(), make_request()
        if identity is not None:
            state.put(AGENT_IDENTITY, identity)
        scores = list(s.score(state, request, eps))
        picked = pick or eps[scores.index(max(scores))]
        s.pre_request(state, request, SchedulingResult({"default": ProfileRunResult((picked,))}, "default"))
        return scores

    scored("agent-a", pick=eps[2])
    assert scored("agent-a") == [0.0, 0.0, 1.0]
    assert scored(None) == [0.0, 0.0, 0.0]  # no identity: no preference
