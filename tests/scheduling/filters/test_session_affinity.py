"""session-affinity-filter: turns return to their endpoint unless it is gone or saturated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.director.requestheader.agent_identity import AgentIdentity
from epp.errors import ConfigError
from epp.flowcontrol.detectors.concurrency import ConcurrencyDetector
from epp.flowcontrol.detectors.utilization import UtilizationDetector
from epp.plugin.state import CycleState
from epp.request import AGENT_IDENTITY, InferenceRequest, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulingResult
from epp.scheduling.filters.session_affinity import SessionAffinityFilter
from epp.scheduling.sessions import encode_token
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import FakeHandle, build


def turn(
    f: SessionAffinityFilter, req: InferenceRequest, eps: Sequence[Endpoint], fallback: Endpoint
) -> tuple[Sequence[Endpoint], ResponseInfo]:
    """One routed request: filter, pick the sole survivor (else ``fallback``), then the hooks."""
    state = CycleState()
    kept = f.filter(state, req, eps)
    picked = kept[0] if len(kept) == 1 else fallback
    result = SchedulingResult({"default": ProfileRunResult((picked,))}, "default")
    f.pre_request(state, req, result)
    resp = ResponseInfo(request_id=req.request_id)
    f.response_header(state, req, resp, picked)
    return kept, resp


def session_filter(handle: FakeHandle | None = None, **params: Any) -> SessionAffinityFilter:
    p = {"strategy": "session_id", "sessionIdConfig": {"sources": [{"header": "x-session-token"}]}}
    f: SessionAffinityFilter = build(SessionAffinityFilter, handle=handle, **(p | params))
    return f


def req(session: str = "", header: str = "x-session-token") -> InferenceRequest:
    return make_request(headers={header: session} if session else {})


def test_session_id_pins_follow_up_turns_to_the_first_turns_endpoint() -> None:
    eps = [make_endpoint(i) for i in range(4)]
    f = session_filter()
    kept, resp = turn(f, req("conv-1"), eps, fallback=eps[2])
    assert kept == eps  # unbound: no preference
    assert resp.headers == {}  # the client owns its session id
    for _ in range(3):
        kept, _ = turn(f, req("conv-1"), eps, fallback=eps[0])
        assert kept == [eps[2]]
    assert turn(f, req("conv-2"), eps, fallback=eps[1])[0] == eps  # another session is unaffected
    assert turn(f, req(), eps, fallback=eps[1])[0] == eps  # no header, no pin


def test_gone_endpoint_falls_through_then_the_session_sticks_to_its_new_endpoint() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    f = session_filter()
    turn(f, req("c"), eps, fallback=eps[0])
    survivors = eps[1:]
    kept, _ = turn(f, req("c"), survivors, fallback=eps[2])
    assert kept == survivors
    assert turn(f, req("c"), survivors, fallback=eps[1])[0] == [eps[2]]
    # a new object for a returning pod with the same name still matches by name
    again = make_endpoint(2)
    assert turn(f, req("c"), [eps[1], again], fallback=eps[1])[0] == [again]


def test_endpoint_removed_forgets_its_sessions() -> None:
    eps = [make_endpoint(i) for i in range(2)]
    f = session_filter()
    turn(f, req("c"), eps, fallback=eps[1])
    f.endpoint_removed(eps[1])
    assert len(f.affinity.bindings) == 0
    assert turn(f, req("c"), eps, fallback=eps[0])[0] == eps


def test_saturated_endpoint_is_skipped_by_the_epps_detector() -> None:
    detector = build(UtilizationDetector, queueDepthThreshold=5)
    handle = FakeHandle([detector])
    f = session_filter(handle)
    handle.plugins().append(f)  # type: ignore[attr-defined]
    idle = [make_endpoint(0), make_endpoint(1)]
    turn(f, req("c"), idle, fallback=idle[1])
    busy = [make_endpoint(0), make_endpoint(1, queue=5)]  # queue at the detector's threshold
    assert turn(f, req("c"), busy, fallback=busy[0])[0] == busy
    # the session moved with the turn; the old endpoint is no longer preferred
    assert turn(f, req("c"), idle, fallback=idle[1])[0] == [idle[0]]
    almost = [make_endpoint(0, queue=4), make_endpoint(1)]
    assert turn(f, req("c"), almost, fallback=almost[1])[0] == [almost[0]]


def test_concurrency_detector_is_used_when_it_is_the_configured_one() -> None:
    class Load:
        def __init__(self, n: int) -> None:
            self.requests, self.tokens = n, 0

    class Source:
        typed_name = None
        loads: dict[str, int] = {}

        def inflight_load(self, ep: Endpoint) -> Load:
            return Load(self.loads.get(ep.name, 0))

    source = Source()
    detector = build(ConcurrencyDetector, maxConcurrency=2)
    handle = FakeHandle([source, detector])
    detector._handle = handle
    f = session_filter(handle)
    eps = [make_endpoint(0), make_endpoint(1)]
    turn(f, req("c"), eps, fallback=eps[0])
    source.loads[eps[0].name] = 1
    assert turn(f, req("c"), eps, fallback=eps[1])[0] == [eps[0]]
    source.loads[eps[0].name] = 2
    assert turn(f, req("c"), eps, fallback=eps[1])[0] == eps


def test_saturation_is_ignored_when_configured() -> None:
    detector = build(UtilizationDetector)
    f = session_filter(FakeHandle([detector]), skipWhenSaturated=False)
    eps = [make_endpoint(0, queue=50), make_endpoint(1)]
    turn(f, req("c"), eps, fallback=eps[0])
    assert turn(f, req("c"), eps, fallback=eps[1])[0] == [eps[0]]


def test_encoded_endpoint_header_writes_and_reads_the_token() -> None:
    eps = [make_endpoint(i) for i in range(3)]
    f: SessionAffinityFilter = build(SessionAffinityFilter)
    kept, resp = turn(f, req(), eps, fallback=eps[1])
    assert kept == eps
    token = resp.headers["x-session-token"]
    assert token == encode_token(eps[1])
    assert turn(f, req(token), eps, fallback=eps[0])[0] == [eps[1]]
    assert turn(f, req("%%garbage%%"), eps, fallback=eps[0])[0] == eps
    assert len(f.affinity.bindings) == 0  # stateless: nothing remembered


def test_bounded_store() -> None:
    f = session_filter(sessionIdConfig={"sources": [{"header": "x-session-token"}], "maxSessions": 3})
    eps = [make_endpoint(0), make_endpoint(1)]
    for i in range(10):
        turn(f, req(f"c{i}"), eps, fallback=eps[i % 2])
    assert len(f.affinity.bindings) == 3


def test_several_sources_first_non_empty_wins() -> None:
    f = session_filter(sessionIdConfig={"sources": [{"header": "x-session-id"}, {"header": "x-conv"}]})
    eps = [make_endpoint(0), make_endpoint(1)]
    turn(f, req("a", header="x-conv"), eps, fallback=eps[1])
    assert turn(f, req("a", header="x-conv"), eps, fallback=eps[0])[0] == [eps[1]]
    assert turn(f, req("a", header="x-session-id"), eps, fallback=eps[0])[0] == [eps[1]]


@pytest.mark.parametrize(
    "params",
    [
        {"strategy": "cookie"},
        {"strategy": "session_id", "sessionIdConfig": {"sources": [{}]}},
    ],
)
def test_bad_config(params: dict[str, Any]) -> None:
    with pytest.raises((ConfigError, ValueError)):
        build(SessionAffinityFilter, **params)


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ({"header": "h", "attribute": "agent-identity"}, "exactly one of header or attribute"),
        ({"attribute": "tenant"}, r"sources.attribute: .tenant. .* .agent-identity. .* .SessionIDDataKey."),
        ({"attribute": "agent-identity", "producer": "session-id-producer"}, "sources.producer"),
    ],
)
def test_bad_source_names_the_field(source: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        build(SessionAffinityFilter, strategy="session_id", sessionIdConfig={"sources": [source]})


def _identity(value: object) -> CycleState:
    state = CycleState()
    state.put(AGENT_IDENTITY, value)  # type: ignore[misc]  # a non-string too, as upstream's vector
    return state


# upstream's TestResolveSessionID vectors: (sources, request headers, agent identity, session id)
RESOLVE: list[tuple[list[dict[str, str]], dict[str, str], object, str]] = [
    ([{"header": "x-session-id"}], {"x-session-id": "sess-1"}, None, "sess-1"),
    ([{"attribute": "agent-identity"}], {}, "agent-42", "agent-42"),
    ([{"attribute": "agent-identity"}], {}, 42, ""),  # not a string: skipped
    (
        [{"header": "x-session-id"}, {"attribute": "agent-identity"}],
        {"x-session-id": "from-header"},
        "from-attr",
        "from-header",
    ),
    ([{"header": "x-session-id"}, {"attribute": "agent-identity"}], {}, "from-attr", "from-attr"),
    ([{"header": "x-session-id"}, {"attribute": "agent-identity"}], {}, None, ""),
    ([{"header": "x-session-id"}], {"x-session-id": "   "}, None, ""),  # blank is empty
]


@pytest.mark.parametrize(("sources", "headers", "identity", "want"), RESOLVE)
def test_resolve_session_id(
    sources: list[dict[str, str]], headers: dict[str, str], identity: object, want: str
) -> None:
    f = build(SessionAffinityFilter, strategy="session_id", sessionIdConfig={"sources": sources})
    assert f.affinity.session(make_request(headers=headers), _identity(identity)) == want


def test_agent_identity_source_pins_an_agent_session_end_to_end() -> None:
    """agent-identity publishes the session header's value; the filter pins on it."""
    agent = build(AgentIdentity)
    f = build(
        SessionAffinityFilter,
        strategy="session_id",
        sessionIdConfig={"sources": [{"attribute": "agent-identity"}]},
    )
    eps = [make_endpoint(i) for i in range(3)]

    def routed(headers: dict[str, str], fallback: Endpoint) -> Sequence[Endpoint]:
        state, request = CycleState(), make_request(headers=headers)
        agent.request_header(state, request)
        kept = f.filter(state, request, eps)
        picked = kept[0] if len(kept) == 1 else fallback
        f.pre_request(state, request, SchedulingResult({"default": ProfileRunResult((picked,))}, "default"))
        return kept

    assert routed({"x-claude-code-session-id": "agent-a"}, fallback=eps[2]) == eps  # first turn: unbound
    assert routed({"x-claude-code-session-id": "agent-a"}, fallback=eps[0]) == [eps[2]]
    assert routed({"session-id": "agent-b"}, fallback=eps[1]) == eps  # another agent: unaffected
    assert routed({}, fallback=eps[0]) == eps  # no identity, no pin


SESSION_ID_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: session-id-producer, parameters: {cookieName: conv}}
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig: {sources: [{attribute: SessionIDDataKey, producer: session-id-producer}]}
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-filter}, {pluginRef: random-picker}]
"""


async def test_session_id_producer_attribute_pins_a_cookie_session_through_the_director() -> None:
    """llm-d's ``{attribute: SessionIDDataKey, producer: session-id-producer}``: the producer reads
    the session from a cookie before scheduling, the filter pins on it (random picks otherwise)."""
    components = build_components(load_config(SESSION_ID_CONFIG), default_registry())
    ds = Datastore()
    for i in range(4):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}", address=f"10.0.0.{i + 1}", port=8000, pod_name=f"pod-{i}"
            )
        )
    director = Director(
        ds, components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    )
    body = b'{"model": "m", "prompt": "hi"}'

    async def routed(cookie: str) -> str:
        lc = director.start({"cookie": cookie} if cookie else {}, {})
        destination = (await lc.route(body)).destination
        lc.close()
        return destination

    first = await routed("conv=c1; other=x")
    assert {await routed("conv=c1") for _ in range(12)} == {first}
    assert len({await routed("") for _ in range(24)}) > 1  # no session: the random picker spreads
