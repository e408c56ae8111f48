"""``inflight-load-producer``: requests and estimated tokens sent to each endpoint and not yet finished."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.origin_shares import SNAPSHOT_ORIGIN, OriginShares
from epp.plugin.replicated import parse_rows, unsynced
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, estimate_tokens
from epp.scheduling.api import SchedulingResult

# P/D: the prefill leg's endpoint is done once the response starts.  Its profile is the one the
# disagg profile handler names (``SchedulingResult.disagg.prefill_profile``), else "prefill".
PREFILL_PROFILE: Final = "prefill"
IDLE: Final = InFlightLoad(requests=0, tokens=0)
NONE: Final = (0, 0)  # an origin's (requests, tokens) on an endpoint it holds nothing on


class InFlightLoadParams(PluginParams):
    """llm-d's ``syncCrossReplicaState`` (default true): share the counts with peer replicas."""

    sync_cross_replica_state: bool = True


class _Counter:
    """One endpoint's in-flight totals, with a cached immutable view for the CycleState.

    ``requests``/``tokens`` are this replica's own; ``peer_requests``/``peer_tokens`` the sum
    of what peers last reported, kept up to date on ``apply`` so a read stays O(1).
    """

    __slots__ = ("_view", "name", "peer_requests", "peer_tokens", "requests", "tokens")

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests = 0
        self.tokens = 0
        self.peer_requests = 0
        self.peer_tokens = 0
        self._view: InFlightLoad | None = IDLE

    def add(self, tokens: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self._view = None

    def release(self, tokens: int) -> None:
        # Exact by construction (each release undoes one recorded add); the clamp only
        # guards the invariant "never negative" against a future misuse (a test, not ``max``:
        # a builtin call each).
        r = self.requests - 1
        t = self.tokens - tokens
        self.requests = r if r > 0 else 0
        self.tokens = t if t > 0 else 0
        self._view = None
        if r <= 0 and t <= 0 and not self.peer_requests and not self.peer_tokens:
            # Idle again (between bursts, most endpoints most of the time): the shared IDLE
            # view, so the next snapshot reads it from the slot instead of making one (~3k).
            self._view = IDLE

    def add_peer(self, requests: int, tokens: int) -> None:
        self.peer_requests += requests
        self.peer_tokens += tokens
        self._view = None

    def view(self) -> InFlightLoad:
        v = self._view
        if v is None:
            v = self._view = _load(self.requests + self.peer_requests, self.tokens + self.peer_tokens)
        return v


# ``InFlightLoad(requests=r, tokens=t)`` without the frozen dataclass's ``__init__``, which sets
# each field through ``object.__setattr__`` (5.6k instructions against 2.9k): the slots' own
# setters, once.  The object is the same (equal, hashable, frozen against later assignment).
_new = object.__new__
_set_requests = getattr(InFlightLoad, "requests").__set__  # noqa: B009 - the slot's descriptor
_set_tokens = getattr(InFlightLoad, "tokens").__set__  # noqa: B009


def _load(requests: int, tokens: int) -> InFlightLoad:
    v: InFlightLoad = _new(InFlightLoad)
    _set_requests(v, requests)
    _set_tokens(v, tokens)
    return v


# What one request added, so its release undoes exactly that: (is the prefill leg, counter,
# tokens) per profile, a list in the request's CycleState (an object with slots cost a Python
# ``__init__`` a request).  Whether a prefill entry is still held is a second state value, put
# only for P/D results, so the response-header hook of any other request finds nothing.
_Entry = tuple[bool, "_Counter", int]


class InFlightLoadProducer(PluginBase):
    """Count what each endpoint is serving for this EPP and its peers.  Type ``inflight-load-producer``.

    Per endpoint (by name) it keeps the number of requests and the estimated tokens
    (``estimate_tokens``: input from the body size, output 1.5 * input) that were sent
    there and have not finished.  Before scheduling it writes ``InFlightLoad(requests,
    tokens)`` for every candidate (``INFLIGHT_LOAD``).  After scheduling (PreRequest) it
    adds the request to the first endpoint of every profile result, and records what it
    added in the request's CycleState, so the release is exact and happens once: the
    ``prefill`` profile's endpoint is released when the response headers arrive (GIE
    releases it on the first body chunk; headers come just before it), every other one
    when the response completes, normally or not.  Counters never go negative.  When an
    endpoint leaves the datastore (EndpointObserver) its counters are dropped; requests
    still in flight there release into the dropped counters, never into a new endpoint
    of the same name.

    ``inflight_load(endpoint)`` reads the live counters outside any request: the
    ``concurrency-detector`` uses it for pool saturation (GIE Appendix A #7).

    Active-active replicas (``epp.plugin.replicated.Replicated``): every count read above is
    this replica's own plus the sum of what each peer last reported, cached per endpoint so a
    read stays O(1).  ``drain`` returns ``[name, requests, tokens]`` — this replica's absolute
    own counts — for each endpoint whose own count changed since the previous drain (so a lost
    or repeated batch cannot drift); ``apply`` replaces the origin's value for those endpoints
    and recomputes only their totals; ``forget(origin)`` removes the origin's counts.  Bookkeeping
    for ``drain`` starts at its first call (no hub: no cost) and marks a dict per change, bounded
    by the endpoints.  ``snapshot`` is ``{"own": {name: [r, t]}, "peers": {origin: {...}}}``;
    ``restore`` keeps the peers' counts under their origins and the source's own counts under a
    placeholder origin that yields, endpoint by endpoint, to the first delta naming the endpoint
    (counts in flight are transient: a brief undercount heals, a double count would not), and
    that any ``forget`` drops.  Parameter ``syncCrossReplicaState`` (true, llm-d's name): false
    sets ``replicated`` to False — the rule for the sync hub is to skip a plugin whose
    ``replicated`` attribute is False — and ``drain`` then always returns ``[]``, so even a hub
    that ignores the flag shares nothing.
    Produces: ``INFLIGHT_LOAD``.  Consumes: nothing.  Parameters: ``syncCrossReplicaState``.
    """

    TYPE: ClassVar[str] = "inflight-load-producer"
    PARAMS: ClassVar[type[PluginParams]] = InFlightLoadParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({INFLIGHT_LOAD})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    # its hooks only count (director.api): they may run after the reply they follow is written
    AFTER_REPLY: ClassVar[bool] = True
    # the counts are a snapshot: taken last, right before scheduling (director/dag.py)
    RUN_LAST: ClassVar[bool] = True

    def __init__(self, name: str, params: InFlightLoadParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.replicated = params.sync_cross_replica_state
        self._counters: dict[str, _Counter] = {}
        # endpoints whose own counts changed since the last drain; None until a hub drains
        self._changed: dict[str, _Counter] | None = None
        # origin -> name -> (requests, tokens) it last reported; keeps the counters' peer sums
        self._peers: OriginShares[tuple[int, int]] = OriginShares(NONE, self._peer_changed)
        self.sync_dirty: Callable[[], None] = unsynced  # the hub's: "send my changes soon"
        # True once the datastore reports endpoints: from then on only endpoints it added
        # get a counter, so one removed between scheduling and PreRequest cannot come back.
        self._observed = False
        self._state_key: StateKey[list[_Entry]] = StateKey(f"{name}/{self.TYPE}")
        self._prefill_key: StateKey[bool] = StateKey(f"{name}/{self.TYPE}/prefill")

    def debug_state(self) -> dict[str, Any]:
        """In-flight requests and tokens per endpoint (only endpoints with work outstanding)."""
        out: dict[str, Any] = {}
        for name, counter in self._counters.items():
            load = counter.view()
            if load.requests or load.tokens:
                out[name] = {"requests": load.requests, "tokens": load.tokens}
        return {"inflight": out}

    # read API ---------------------------------------------------------------------
    def inflight_load(self, endpoint: Endpoint) -> InFlightLoad | None:
        """The endpoint's current load; None when the EPP has never sent it anything."""
        counter = self._counters.get(endpoint.metadata.name)
        return None if counter is None else counter.view()

    def load_of(self, endpoint: Endpoint) -> InFlightLoad:
        """The endpoint's current load (zero when unknown)."""
        counter = self._counters.get(endpoint.metadata.name)
        return IDLE if counter is None else counter.view()

    # DataProducer -------------------------------------------------------------------
    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        self.prepare_request_data_now(state, request, endpoints)

    def prepare_request_data_now(
        self, state: CycleState, request: InferenceRequest | None, endpoints: Sequence[Endpoint]
    ) -> None:
        """Never waits: the director calls this without a coroutine (director.api.ImmediateProducer).

        Each counter's view is read from its slot; only a counter changed since the last read
        (the endpoint the previous request went to, usually) makes a new one.
        """
        counters = self._counters
        values: dict[Any, InFlightLoad] = {}
        for ep in endpoints:
            counter = counters.get(ep.metadata.name)
            if counter is None:
                values[ep] = IDLE
            else:
                v = counter._view
                values[ep] = v if v is not None else counter.view()
        state.set_attributes(INFLIGHT_LOAD, values)

    def prepare(self, state: CycleState, endpoints: Sequence[Endpoint]) -> None:
        """``prepare_request_data`` without a request (it reads none)."""
        self.prepare_request_data_now(state, None, endpoints)

    # PreRequest ---------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        """Add the request to the first endpoint of every profile result and remember what it added.

        The usual result has one profile: one counter, updated in place here (``_Counter.add``
        inlined), one entry.
        """
        added = state.get(self._state_key)
        if added is None:
            added = []
            state.put(self._state_key, added)
        tokens = -1
        prefill_profile = PREFILL_PROFILE if result.disagg is None else result.disagg.prefill_profile
        counters = self._counters
        changed = self._changed
        for profile, run in result.profile_results.items():
            if run is None or not run.target_endpoints:
                continue
            if tokens < 0:
                tokens = estimate_tokens(request)
            name = run.target_endpoints[0].metadata.name
            counter = counters.get(name)
            if counter is None:
                counter = self._counter(name)
            counter.requests += 1
            counter.tokens += tokens
            counter._view = None
            if changed is not None:
                changed[name] = counter
                self.sync_dirty()
            prefill = profile == prefill_profile
            added.append((prefill, counter, tokens))
            if prefill:
                state.put(self._prefill_key, True)

    def _counter(self, name: str) -> _Counter:
        counter = self._counters.get(name)
        if counter is None:
            counter = _Counter(name)
            self._add_peers(counter)
            if not self._observed:  # no datastore wiring: count every endpoint we see
                self._counters[name] = counter
            # else: the endpoint left the datastore; count into a detached counter
        return counter

    # response side ------------------------------------------------------------------
    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        if not state.get(self._prefill_key):
            return
        state.put(self._prefill_key, False)
        added = state.get(self._state_key) or []
        kept = []
        for entry in added:
            prefill, counter, tokens = entry
            if prefill:
                counter.release(tokens)
                if self._changed is not None:
                    self._changed[counter.name] = counter
                    self.sync_dirty()
            else:
                kept.append(entry)
        added[:] = kept

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        added = state.get(self._state_key)
        if not added:
            return
        entries = added[:]
        added.clear()  # released once, whatever calls follow
        changed = self._changed
        for _, counter, tokens in entries:
            counter.release(tokens)
            if changed is not None:
                changed[counter.name] = counter
        if changed is not None:
            self.sync_dirty()

    # EndpointObserver ---------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        self._observed = True
        name = endpoint.metadata.name
        if name not in self._counters:
            counter = self._counters[name] = _Counter(name)
            self._add_peers(counter)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._counters.pop(endpoint.metadata.name, None)

    # Replicated ---------------------------------------------------------------------
    @property
    def sync_key(self) -> str:
        return f"{self.TYPE}/{self.typed_name.name}"

    def drain(self) -> list[Any]:
        """``[name, requests, tokens]``: own absolute counts of the endpoints changed since the last call."""
        if not self.replicated:
            return []
        changed = self._changed
        self._changed = {}
        if not changed:
            return []
        return [[name, c.requests, c.tokens] for name, c in changed.items()]

    def resend(self) -> None:
        """Mark every own count changed, so the next ``drain`` carries them all (zeros too): a peer
        that lost a batch of ours takes the whole picture again (the hub's resync)."""
        if self._changed is not None:
            self._changed.update(self._counters)

    def apply(self, origin: str, deltas: Any) -> None:
        """Replace ``origin``'s counts on the endpoints ``deltas`` name; ValueError leaves state as it was.

        ``deltas`` is checked here, not by its annotation: compiled (mypyc), a ``list`` annotation
        would fail a peer's malformed message with TypeError before the check.
        """
        self._peers.apply(origin, _parse_loads(deltas))

    def forget(self, origin: str) -> None:
        """Drop ``origin``'s in-flight counts (and any a snapshot restored: they are as stale)."""
        self._peers.forget(origin)

    def _peer_changed(self, name: str, new: tuple[int, int], old: tuple[int, int]) -> None:
        """An origin's counts on ``name`` went from ``old`` to ``new``: the counter's peer sum follows."""
        counter = self._counters.get(name)
        if counter is not None:
            counter.add_peer(new[0] - old[0], new[1] - old[1])
        elif not self._observed and new != NONE:
            self._counter(name)  # no datastore wiring: count every endpoint named (sums the table)

    def snapshot(self) -> dict[str, Any]:
        own = {name: [c.requests, c.tokens] for name, c in self._counters.items() if c.requests or c.tokens}
        peers = {o: {n: list(v) for n, v in m.items()} for o, m in self._peers.peers().items()}
        return {"own": own, "peers": peers}

    def restore(self, snapshot: Any) -> None:
        """Adopt a peer's ``snapshot()``: its peers' counts by origin, its own under a placeholder."""
        if not isinstance(snapshot, dict) or not isinstance(snapshot.get("own"), dict):
            raise ValueError("inflight snapshot: expected a map with 'own' and 'peers' maps")  # noqa: TRY004
        peers = snapshot.get("peers")
        if not isinstance(peers, dict) or not all(isinstance(o, str) for o in peers):
            raise ValueError("inflight snapshot: 'peers' must map origin names to count maps")
        batches = [(o, _parse_loads(_parse_map(m))) for o, m in peers.items()]
        batches.append(
            (SNAPSHOT_ORIGIN, _parse_loads(_parse_map(snapshot["own"])))
        )  # checked: all or nothing
        self._peers.restore(batches)

    def _add_peers(self, counter: _Counter) -> None:
        for requests, tokens in self._peers.values_of(counter.name):
            counter.add_peer(requests, tokens)


def _parse_loads(deltas: Any) -> list[tuple[str, tuple[int, int]]]:
    """``[[endpoint name, requests >= 0, tokens >= 0], ...]``, checked whole before any of it is applied."""
    return parse_rows(
        deltas,
        "inflight delta",
        3,
        lambda d: isinstance(d[0], str) and all(type(v) is int and v >= 0 for v in d[1:]),
        "[endpoint name, requests >= 0, tokens >= 0]",
        lambda d: (d[0], (d[1], d[2])),
    )


def _parse_map(counts: Any) -> list[Any]:
    if not isinstance(counts, dict):
        raise ValueError(f"inflight snapshot: expected a map of endpoint counts, got {type(counts).__name__}")  # noqa: TRY004
    return [[name, *v] if isinstance(v, (list, tuple)) else [name, v] for name, v in counts.items()]
