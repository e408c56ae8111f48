"""The session store: bounded by size (LRU) and idle time, counts per endpoint; the token codec."""

from __future__ import annotations

import base64

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.scheduling.sessions import SessionBindings, decode_token, encode_token, find
from epp.testing.builders import make_endpoint
from epp.testing.clock import ManualClock


def test_bind_get_and_rebind_move_counts() -> None:
    b = SessionBindings(max_sessions=10, ttl=0)
    b.bind("s1", "a")
    b.bind("s2", "a")
    assert b.get("s1") == "a"
    assert b.sessions_on("a") == 2
    b.bind("s1", "b")
    assert (b.get("s1"), b.sessions_on("a"), b.sessions_on("b")) == ("b", 1, 1)


def test_least_recently_used_session_is_evicted_beyond_max() -> None:
    b = SessionBindings(max_sessions=2, ttl=0)
    b.bind("s1", "a")
    b.bind("s2", "b")
    b.get("s1")  # a read does not refresh: only binding (a routed turn) counts as use
    b.bind("s1", "a")  # s1 is used again: s2 is now the coldest
    b.bind("s3", "c")
    assert len(b) == 2
    assert b.get("s2") is None
    assert (b.get("s1"), b.get("s3")) == ("a", "c")
    assert b.sessions_on("b") == 0


def test_idle_sessions_expire_on_read_and_on_bind() -> None:
    clock = ManualClock(100.0)
    b = SessionBindings(max_sessions=100, ttl=10, clock=clock)
    b.bind("old", "a")
    clock.now += 5
    b.bind("young", "b")
    clock.now += 6  # old idle 11 s, young 6 s
    assert b.get("old") is None
    assert b.get("young") == "b"
    b.bind("other", "a")
    clock.now += 5  # young idle 11 s: dropped by the next bind, before any read
    b.bind("third", "c")
    assert len(b) == 2
    assert b.sessions_on("b") == 0


def test_forget_endpoint_drops_its_sessions_only() -> None:
    b = SessionBindings(max_sessions=10, ttl=0)
    for s, n in (("s1", "a"), ("s2", "b"), ("s3", "a")):
        b.bind(s, n)
    assert b.forget_endpoint("a") == 2
    assert (b.get("s1"), b.get("s2"), b.get("s3")) == (None, "b", None)
    assert b.sessions_on("a") == 0


def test_token_round_trip_and_garbage() -> None:
    ep = make_endpoint(3)
    assert decode_token(encode_token(ep)) == ep.name
    assert decode_token("not base64 !") is None
    assert decode_token("") == ""


def _k8s_endpoint(pod: str, rank: int = 0, namespace: str = "prod") -> Endpoint:
    """As the pool reconciler names them: ``<pod>-rank-<i>``, namespace separate."""
    return Endpoint(
        EndpointMetadata(
            name=f"{pod}-rank-{rank}", address="10.0.0.1", port=8000 + rank, pod_name=pod, namespace=namespace
        )
    )


def test_token_is_llm_ds_namespaced_name() -> None:
    """llm-d-router issues base64 of ``NamespacedName.String()``: ``prod/vllm-0-rank-0``."""
    ep = _k8s_endpoint("vllm-0")
    assert encode_token(ep) == base64.b64encode(b"prod/vllm-0-rank-0").decode()


def test_every_token_form_finds_its_endpoint() -> None:
    eps = [_k8s_endpoint("vllm-0"), _k8s_endpoint("vllm-1"), _k8s_endpoint("vllm-1", rank=1)]
    assert find(eps, decode_token(encode_token(eps[2]))) is eps[2]  # ours = llm-d's
    assert find(eps, "prod/vllm-1-rank-1") is eps[2]  # a token from the Go EPP
    assert find(eps, "vllm-1-rank-1") is eps[2]  # this EPP's tokens before it issued llm-d's form
    assert find(eps, "prod/vllm-1") is eps[1]  # <namespace>/<pod>: the pod's first rank
    assert find(eps, "staging/vllm-1-rank-1") is None  # another namespace's pod
    assert find(eps, "prod/vllm-9") is None
