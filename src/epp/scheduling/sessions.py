"""What the session-affinity filter and scorer share: the session store, the token codec, saturation.

A multi-turn conversation's context lives in the KV cache of the replica that served its
last turn; sending the next turn there turns a full prefill into a cache hit.  Two ways to
remember where that is, both llm-d's:

* ``encoded_endpoint_header``: stateless.  The response carries the serving endpoint's name,
  base64-encoded, in a header the client echoes back (inference-perf's
  ``session_token_header_key: x-session-token``).
* ``session_id``: stateful.  The client sends an opaque session id; the EPP keeps
  session -> endpoint name in a ``SessionBindings`` store bounded by size (LRU) and idle
  time (TTL), so memory does not grow with the number of conversations ever seen.

Endpoints are remembered by name, not by object: a binding to an endpoint that left the
pool matches no candidate and the request falls through to normal scoring, after which the
session is rebound to wherever it was served.

Active-active replicas share the ``session_id`` bindings (``epp.plugin.replicated.Replicated``,
implemented by ``SessionHooks`` for both plugins): a conversation's turns may reach any
replica, and each must send the turn where the last one went.  A delta is ``[session, endpoint
name, age]`` (seconds since the binding was last used, so it expires at the same moment on
every replica whatever its TTL setting or clock), for the sessions this replica bound since
the previous drain; a peer's binding replaces a local one only when it is more recent.
``forget`` is a no-op: where a departed peer sent the session is still where its context is
cached.  The ``encoded_endpoint_header`` strategy has nothing to share (the client carries
the binding): its ``replicated`` is False and ``drain`` returns ``[]``.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle
from epp.plugin.counts import subtract
from epp.plugin.keys import StateKey
from epp.plugin.replicated import parse_rows, unsynced
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo
from epp.scheduling.api import SchedulingResult


def token_name(endpoint: Endpoint) -> str:
    """What a token names: ``<namespace>/<name>``, the Go EPP's ``NamespacedName`` of the endpoint
    (its endpoints are ``<pod>-rank-<i>`` too), so a token either EPP issued routes on the other
    after a swap; the bare name when the endpoint has no namespace or its name already has one."""
    md = endpoint.metadata
    return f"{md.namespace}/{md.name}" if md.namespace and "/" not in md.name else md.name


def encode_token(endpoint: Endpoint) -> str:
    """The ``encoded_endpoint_header`` value that names ``endpoint``: base64 of ``token_name``."""
    return base64.b64encode(token_name(endpoint).encode()).decode("ascii")


def decode_token(token: str) -> str | None:
    """The endpoint name in a token, or None when the token is not one of ours."""
    try:
        return base64.b64decode(token.encode("ascii"), validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        return None


def find(endpoints: Sequence[Endpoint], name: str | None) -> Endpoint | None:
    """The endpoint ``name`` names, in any form a token may carry: the bare endpoint name (this
    EPP before it issued llm-d's form; a session binding), ``<namespace>/<endpoint name>`` (llm-d's
    form, issued here too), or ``<namespace>/<pod name>`` (a pod's first listed rank)."""
    if not name:
        return None
    ns, sep, rest = name.partition("/")
    by_pod: Endpoint | None = None
    for ep in endpoints:
        if ep.name == name:
            return ep
        if sep:
            md = ep.metadata
            if md.namespace == ns:
                if md.name == rest:
                    return ep
                if by_pod is None and md.pod_name == rest:
                    by_pod = ep
    return by_pod


# Where a session id is read: a request header (lower-cased name) or a request-level value a
# request-header plugin put in the cycle state (llm-d's ``sessionIdConfig.sources[].attribute``).
SessionSource = str | StateKey[str]


def header_value(
    request: InferenceRequest, names: Sequence[SessionSource], state: CycleState | None = None
) -> str:
    """The first value among the sources ``names``, in order, that is not blank once trimmed
    (upstream's ``resolveSessionID``; an attribute that is not a string is skipped)."""
    for name in names:
        if isinstance(name, str):
            value = request.headers.get(name)
        else:  # a CycleState is a dict: an empty one is falsy, so test for None
            value = state.get(name) if state is not None else None
        if isinstance(value, str) and (value := value.strip()):
            return value
    return ""


class SessionBindings:
    """session id -> endpoint name, least recently used first; bounded by ``max_sessions`` and ``ttl``.

    Expiry is lazy: a lookup ignores (and drops) an idle binding, and every ``bind`` drops
    expired bindings from the cold end, which is the LRU end because the TTL counts from
    last use.  So no sweeper task is needed and the store never holds more than
    ``max_sessions``.  Per-endpoint counts of bound sessions place new sessions evenly.
    Once ``drain`` has been called (a sync hub is attached), ``bind`` also marks the session
    for the next drain (at most ``max_sessions`` marks); ``learn`` takes a peer's binding.
    """

    def __init__(self, *, max_sessions: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.clock = clock
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._undrained: dict[str, None] | None = None  # sessions bound here since the last drain
        self.on_change: Callable[[], None] = unsynced  # the sync hub's dirty(), once bound

    def __len__(self) -> int:
        return len(self._bindings)

    def get(self, session: str) -> str | None:
        entry = self._bindings.get(session)
        if entry is None:
            return None
        name, used = entry
        if self.ttl > 0 and self.clock() - used > self.ttl:
            self._drop(session)
            return None
        return name

    def bind(self, session: str, name: str) -> None:
        now = self.clock()
        self._put(session, name, now)
        self._evict(now)
        u = self._undrained
        if u is not None and (len(u) < self.max_sessions or session in u):
            u[session] = None
            self.on_change()

    def learn(self, session: str, name: str, age: float) -> None:
        """A peer's binding, last used ``age`` seconds ago; kept unless expired or older than ours."""
        now = self.clock()
        if self.ttl > 0 and age > self.ttl:
            return
        used = now - age
        old = self._bindings.get(session)
        if old is not None and old[1] >= used:
            return
        self._put(session, name, used)
        self._evict(now)

    def drain(self) -> list[list[Any]]:
        """``[session, name, age]`` for the sessions bound here since the last call (still bound)."""
        marked, self._undrained = self._undrained, {}
        if not marked:
            return []
        now = self.clock()
        b = self._bindings
        return [[s, e[0], now - e[1]] for s in marked if (e := b.get(s)) is not None]

    def dump(self) -> list[list[Any]]:
        """Every binding not yet expired as ``[session, name, age]``, least recently used first."""
        now = self.clock()
        ttl = self.ttl
        return [
            [s, n, now - used] for s, (n, used) in self._bindings.items() if ttl <= 0 or now - used <= ttl
        ]

    def _put(self, session: str, name: str, used: float) -> None:
        old = self._bindings.pop(session, None)
        if old is not None:
            self._uncount(old[0])
        self._bindings[session] = (name, used)
        self._counts[name] = self._counts.get(name, 0) + 1

    def sessions_on(self, name: str) -> int:
        return self._counts.get(name, 0)

    def forget_endpoint(self, name: str) -> int:
        """Drop every binding to ``name`` (the endpoint left the pool); returns how many."""
        gone = [s for s, (n, _) in self._bindings.items() if n == name]
        for s in gone:
            self._drop(s)
        return len(gone)

    def _evict(self, now: float) -> None:
        b = self._bindings
        while len(b) > self.max_sessions:
            self._drop(next(iter(b)))
        if self.ttl > 0:
            while b:
                session, (_, used) = next(iter(b.items()))
                if now - used <= self.ttl:
                    break
                self._drop(session)

    def _drop(self, session: str) -> None:
        entry = self._bindings.pop(session, None)
        if entry is not None:
            self._uncount(entry[0])

    def _uncount(self, name: str) -> None:
        subtract(self._counts, name, 1)


@runtime_checkable
class _Detector(Protocol):
    """A flow-control saturation detector, structurally (scheduling may not import flowcontrol)."""

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


class SaturationProbe:
    """Whether one endpoint is saturated, by the EPP's own saturation detector.

    The detector is the configured plugin that implements ``saturation(endpoints)`` (the
    ``utilization-detector`` admission adds by default, or a ``concurrency-detector``):
    ``saturation([endpoint]) >= 1.0`` is exactly when that detector's filter would drop the
    endpoint (queue or KV cache at its threshold, or in-flight load at capacity), and stale
    metrics count as not saturated, as everywhere else in the EPP.  Looked up once, on first
    use, because the admission concept adds its default detector after the plugins are built.
    """

    def __init__(self, handle: Handle, owner: object) -> None:
        self._handle = handle
        self._owner = owner
        self._detector: _Detector | None = None
        self._looked = False

    def detector(self) -> _Detector | None:
        if not self._looked:
            self._looked = True
            self._detector = next(
                (p for p in self._handle.plugins() if p is not self._owner and isinstance(p, _Detector)),
                None,
            )
        return self._detector

    def saturated(self, endpoint: Endpoint) -> bool:
        d = self.detector()
        return d is not None and d.saturation([endpoint]) >= 1.0


ENCODED: Final = "encoded_endpoint_header"


class SessionAffinity:
    """The behaviour both plugins share; each plugin owns one (and so one store).

    ``stateful`` picks the ``session_id`` strategy (a ``SessionBindings`` store), otherwise
    the endpoint is named by the token the client echoes.  ``bound`` is the endpoint the
    session should return to, or None when there is none among the candidates or it is
    saturated; ``after_pick`` (re)binds the session to the endpoint that was chosen, which
    holds the newest context once it has served this turn; ``response_header`` hands the
    client its token.
    """

    def __init__(
        self,
        handle: Handle,
        owner: object,
        *,
        stateful: bool,
        sync_key: str,
        headers: Sequence[SessionSource],
        response_header: str,
        profile_name: str,
        skip_when_saturated: bool,
        max_sessions: int,
        ttl: float,
    ) -> None:
        self.stateful = stateful
        self.sync_key = sync_key
        self.headers = tuple(h.lower() if isinstance(h, str) else h for h in headers)
        self.response_header_name = response_header.lower()
        self.profile_name = profile_name
        self.skip_when_saturated = skip_when_saturated
        self.bindings = SessionBindings(max_sessions=max_sessions, ttl=ttl)
        self.probe = SaturationProbe(handle, owner)
        self._picked = StateKey[Endpoint](f"session-affinity/picked/{id(self)}")  # this instance's

    def session(self, request: InferenceRequest, state: CycleState | None = None) -> str:
        return header_value(request, self.headers, state)

    def bound_name(self, request: InferenceRequest, state: CycleState | None = None) -> str | None:
        value = self.session(request, state)
        if not value:
            return None
        return self.bindings.get(value) if self.stateful else decode_token(value)

    def bound(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint], state: CycleState | None = None
    ) -> Endpoint | None:
        ep = find(endpoints, self.bound_name(request, state))
        return None if ep is not None and self.released(ep) else ep

    def released(self, endpoint: Endpoint) -> bool:
        """Whether sessions let go of ``endpoint`` for now (``skip_when_saturated`` and saturated)."""
        return self.skip_when_saturated and self.probe.saturated(endpoint)

    def after_pick(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        run = result.profile_results.get(self.profile_name or result.primary_profile_name)
        if run is None or not run.target_endpoints:
            return
        target = run.target_endpoints[0]
        state.put(self._picked, target)
        if self.stateful:
            session = self.session(request, state)
            if session:
                self.bindings.bind(session, target.name)

    def response_header(self, state: CycleState, response: ResponseInfo, target: Endpoint | None) -> None:
        if self.stateful:
            return  # the client owns its session id
        picked = state.get(self._picked) or target
        if picked is not None:
            response.headers[self.response_header_name] = encode_token(picked)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.bindings.forget_endpoint(endpoint.name)


class SessionHooks:
    """The request-lifecycle hooks the filter and the scorer share: both own a ``SessionAffinity``
    and (re)bind the session after the pick, hand out the token, and forget removed endpoints.
    Also their ``Replicated`` side (module docstring): the sync hub skips a plugin whose
    ``replicated`` is False (the ``encoded_endpoint_header`` strategy)."""

    affinity: SessionAffinity

    @property
    def replicated(self) -> bool:
        return self.affinity.stateful

    @property
    def sync_key(self) -> str:
        return self.affinity.sync_key

    @property
    def sync_dirty(self) -> Callable[[], None]:
        """The hub's "send my changes soon", called when a session is bound here."""
        return self.affinity.bindings.on_change

    @sync_dirty.setter
    def sync_dirty(self, hook: Callable[[], None]) -> None:
        self.affinity.bindings.on_change = hook

    def drain(self) -> list[Any]:
        return self.affinity.bindings.drain() if self.affinity.stateful else []

    def apply(self, origin: str, deltas: list[Any]) -> None:
        """Learn a peer's bindings; a malformed batch raises ValueError before any of it is kept."""
        learn = self.affinity.bindings.learn
        for session, name, age in _parse_bindings(deltas, "session-affinity delta"):
            learn(session, name, age)

    def forget(self, origin: str) -> None:
        """Nothing: a departed peer's sessions still have their context where it sent them."""

    def snapshot(self) -> list[list[Any]]:
        return self.affinity.bindings.dump()

    def restore(self, snapshot: Any) -> None:
        learn = self.affinity.bindings.learn
        for session, name, age in _parse_bindings(snapshot, "session-affinity snapshot"):
            learn(session, name, age)

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.affinity.after_pick(state, request, result)

    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        self.affinity.response_header(state, response, target)

    def endpoint_added(self, endpoint: Endpoint) -> None:
        pass

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.affinity.endpoint_removed(endpoint)


def _parse_bindings(deltas: Any, what: str) -> list[tuple[str, str, float]]:
    """Check a whole batch of ``[session, endpoint name, age >= 0]`` before any of it is used."""
    return parse_rows(
        deltas,
        what,
        3,
        lambda d: (
            isinstance(d[0], str)
            and isinstance(d[1], str)
            and type(d[2]) in (int, float)
            and math.isfinite(d[2])
            and d[2] >= 0
        ),
        "[session, endpoint name, age seconds >= 0]",
        lambda d: (d[0], d[1], float(d[2])),
    )
