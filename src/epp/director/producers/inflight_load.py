"""``inflight-load-producer``: requests and estimated tokens sent to each endpoint and not yet finished."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.base import Handle, NoParams, PluginBase
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, estimate_tokens
from epp.scheduling.api import SchedulingResult

# P/D: the prefill leg's endpoint is done once the response starts.  Its profile is the one the
# disagg profile handler names (``SchedulingResult.disagg.prefill_profile``), else "prefill".
PREFILL_PROFILE: Final = "prefill"
IDLE: Final = InFlightLoad(requests=0, tokens=0)


class _Counter:
    """One endpoint's in-flight totals, with a cached immutable view for the CycleState."""

    __slots__ = ("_view", "requests", "tokens")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self._view: InFlightLoad | None = IDLE

    def add(self, tokens: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self._view = None

    def release(self, tokens: int) -> None:
        # Exact by construction (each release undoes one recorded add); the clamp only
        # guards the invariant "never negative" against a future misuse.
        self.requests = max(self.requests - 1, 0)
        self.tokens = max(self.tokens - tokens, 0)
        self._view = None

    def view(self) -> InFlightLoad:
        v = self._view
        if v is None:
            v = self._view = InFlightLoad(requests=self.requests, tokens=self.tokens)
        return v


class _Added:
    """What one request added, so its release undoes exactly that (profile, counter, tokens)."""

    __slots__ = ("entries", "prefill")

    def __init__(self) -> None:
        self.entries: list[tuple[bool, _Counter, int]] = []  # (is the prefill leg, counter, tokens)
        self.prefill = False  # an entry of the prefill profile is still held


class InFlightLoadProducer(PluginBase):
    """Count what each endpoint is serving for this EPP.  Type ``inflight-load-producer``.

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
    Produces: ``INFLIGHT_LOAD``.  Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "inflight-load-producer"
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({INFLIGHT_LOAD})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()
    # the counts are a snapshot: taken last, right before scheduling (director/dag.py)
    RUN_LAST: ClassVar[bool] = True

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._counters: dict[str, _Counter] = {}
        # True once the datastore reports endpoints: from then on only endpoints it added
        # get a counter, so one removed between scheduling and PreRequest cannot come back.
        self._observed = False
        self._state_key: StateKey[_Added] = StateKey(f"{name}/{self.TYPE}")

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
        self.prepare(state, endpoints)

    def prepare(self, state: CycleState, endpoints: Sequence[Endpoint]) -> None:
        """The synchronous body of ``prepare_request_data`` (benchmarks call it)."""
        counters = self._counters
        values: dict[Any, InFlightLoad] = {}
        for ep in endpoints:
            counter = counters.get(ep.metadata.name)
            values[ep] = IDLE if counter is None else counter.view()
        state.set_attributes(INFLIGHT_LOAD, values)

    # PreRequest ---------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        added = state.get(self._state_key)
        if added is None:
            added = _Added()
            state.put(self._state_key, added)
        tokens = -1
        prefill_profile = PREFILL_PROFILE if result.disagg is None else result.disagg.prefill_profile
        for profile, run in result.profile_results.items():
            if run is None or not run.target_endpoints:
                continue
            if tokens < 0:
                tokens = estimate_tokens(request)
            counter = self._counter(run.target_endpoints[0].metadata.name)
            counter.add(tokens)
            prefill = profile == prefill_profile
            added.entries.append((prefill, counter, tokens))
            if prefill:
                added.prefill = True

    def _counter(self, name: str) -> _Counter:
        counter = self._counters.get(name)
        if counter is None:
            counter = _Counter()
            if not self._observed:  # no datastore wiring: count every endpoint we see
                self._counters[name] = counter
            # else: the endpoint left the datastore; count into a detached counter
        return counter

    # response side ------------------------------------------------------------------
    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        added = state.get(self._state_key)
        if added is None or not added.prefill:
            return
        added.prefill = False
        kept = []
        for entry in added.entries:
            prefill, counter, tokens = entry
            if prefill:
                counter.release(tokens)
            else:
                kept.append(entry)
        added.entries = kept

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        added = state.get(self._state_key)
        if added is None:
            return
        entries, added.entries, added.prefill = added.entries, [], False
        for _, counter, tokens in entries:
            counter.release(tokens)

    # EndpointObserver ---------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        self._observed = True
        self._counters.setdefault(endpoint.metadata.name, _Counter())

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._counters.pop(endpoint.metadata.name, None)
