"""``prefill-load-scorer``: prefer the endpoint with the least prefill work ahead of this request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH
from epp.plugin.base import Handle, NoParams, PluginBase
from epp.plugin.counts import subtract
from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.origin_shares import SNAPSHOT_ORIGIN, OriginShares
from epp.plugin.replicated import parse_rows, unsynced
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo, prompt_tokens
from epp.scheduling.api import SchedulingResult, ScorerCategory

# One request's prefill tokens held on one endpoint until its first response byte: (endpoint
# name, tokens) in the request's CycleState, replaced by None once released (a tuple, not an
# object with slots: that cost a Python ``__init__`` a request).
_Pending = tuple[str, int]


class PrefillLoadScorer(PluginBase):
    """Score by the prefill work an endpoint has ahead: tokens it still has to prefill for requests
    this EPP sent it, plus the part of this prompt it does not already hold in its prefix cache.
    Type ``prefill-load-scorer`` (ours; GIE has none), category Balance.

    Time to first token is mostly prefill queued ahead plus this prompt's uncached prefill, so
    one quantity weighs cache affinity against load: a replica holding the prefix wins until
    its backlog costs more than recomputing the prefix elsewhere.  The backlog is the EPP's
    own count, updated at dispatch, so a burst arriving between two metric scrapes does not
    herd onto the replica that looked idle.  ``est = backlog + max(prompt - cached, 0)``;
    scores are min-max normalised, lowest estimate 1.0 (all equal: 1.0 each).

    Consumes: PREFIX_MATCH (cached blocks per endpoint; without it every prompt counts as
    uncached), and reads the precise scorer's PrecisePrefixCacheMatchInfoKey instead when one
    is configured: a prefix the approximate index still remembers but the engine evicted
    costs its full prefill again.  Prompt tokens ≈ body bytes / 4.  A request's tokens leave
    the backlog at its first response body byte (prefill done), or when it ends.
    Parameters: none.

    Active-active replicas (``epp.plugin.replicated.Replicated``): the backlog read is this
    replica's own plus what each peer last reported, so a burst split over the replicas does not
    herd onto the endpoint each one alone sees idle (measured with 4 replicas behind one Envoy,
    bench/scaleout part ``quality``).  ``drain`` returns ``[name, tokens]`` — this replica's
    absolute own backlog — for each endpoint whose own backlog changed since the previous drain,
    so a lost or repeated batch cannot drift; ``apply`` replaces the origin's value on those
    endpoints; ``forget(origin)`` drops the origin's backlog (work in flight).  ``snapshot`` is
    ``{"own": {name: tokens}, "peers": {origin: {name: tokens}}}``; ``restore`` keeps the
    peers' backlog by origin and the source's own under a placeholder that yields, endpoint by
    endpoint, to the first delta naming it, and that any ``forget`` drops.  Bookkeeping for
    ``drain`` starts at its first call (no hub: one ``None`` check per change).
    """

    TYPE: ClassVar[str] = "prefill-load-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE
    BOUNDED: ClassVar[bool] = True
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})
    # its hooks only count (director.api): they may run after the reply they follow is written
    AFTER_REPLY: ClassVar[bool] = True
    # its response hook releases the backlog at the first body byte and does nothing after
    FIRST_BYTE_ONLY: ClassVar[bool] = True

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._backlog: dict[str, int] = {}  # endpoint name -> pending prefill tokens, own + peers'
        self._own: dict[str, int] = {}  # this replica's share of _backlog
        # origin -> name -> its last reported backlog; keeps _backlog's peers' share
        self._peers: OriginShares[int] = OriginShares(0, self._peer_changed)
        self._changed: set[str] | None = None  # own backlog changed since the last drain; None: no hub
        self._reported: set[str] = set()  # endpoints a drain ever named: what peers may hold of ours
        self.sync_dirty: Callable[[], None] = unsynced  # the hub's: "send my changes soon"
        self._key: StateKey[_Pending | None] = StateKey(f"{name}/{self.TYPE}")

    def debug_state(self) -> dict[str, Any]:
        """Pending prefill tokens per endpoint: the total scored, this replica's own share, and
        what each peer last reported (``/debug/plugins/state``)."""
        return {
            "backlog": dict(self._backlog),
            "own": dict(self._own),
            "peers": self._peers.debug(),
        }

    def backlog(self, endpoint: Endpoint) -> int:
        return self._backlog.get(endpoint.name, 0)

    # Scorer ---------------------------------------------------------------------------
    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        """``min_max_scores`` of the estimates, the bounds taken in the same pass that makes them.

        One Python loop: ``min``/``max`` and ``max(prompt - cached, 0)`` per endpoint were
        builtin calls (each ~2k instructions on a few endpoints, argument parsing included),
        and ``min_max_scores``'s set and memo pay off only for many equal readings.  The
        floats are ``min_max_scores``'s: ``(hi - v) / float(hi - lo)``.
        """
        backlog = self._backlog
        pending = backlog.get
        prompt = request.prompt_token_count  # kept by the first ``prompt_tokens`` call
        if prompt < 0:
            prompt = prompt_tokens(request)
        # ``prefix_matches(state)``, inlined: a call less
        get = (state.attributes(PRECISE_PREFIX_MATCH) or state.attributes(PREFIX_MATCH)).get
        estimates: list[int] = []
        append = estimates.append
        lo = hi = -1  # estimates are >= 0
        for ep in endpoints:
            info = get(ep)
            u = prompt - info.match_blocks * info.block_size_tokens if info is not None else prompt
            e = u if u > 0 else 0
            if backlog:  # nothing pending anywhere (an idle pool): no lookup per endpoint (~0.5k)
                e += pending(ep.metadata.name, 0)  # ``Endpoint.name`` is a property, a call
            append(e)
            if e > hi:
                hi = e
            if e < lo or lo < 0:
                lo = e
        if hi == lo:
            return [1.0] * len(estimates)
        span = float(hi - lo)
        scores: list[float] = []  # a loop, not a comprehension: on 3.11 one costs a function and a frame
        append_score = scores.append
        for v in estimates:
            append_score((hi - v) / span)
        return scores

    # PreRequest: the chosen endpoint takes this prompt's uncached prefill -----------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        primary = result.profile_results.get(result.primary_profile_name)
        if primary is None or not primary.target_endpoints:
            return
        target = primary.target_endpoints[0]
        # its uncached prefill, max(prompt - cached, 0); ``prefix_matches(state)`` inlined
        info = (state.attributes(PRECISE_PREFIX_MATCH) or state.attributes(PREFIX_MATCH)).get(target)
        tokens = request.prompt_token_count  # the scorer's ``prompt_tokens`` call kept it
        if tokens < 0:
            tokens = prompt_tokens(request)
        if info is not None:
            tokens -= info.match_blocks * info.block_size_tokens
            if tokens < 0:
                tokens = 0
        name = target.metadata.name  # ``Endpoint.name`` is a property
        backlog = self._backlog
        own = self._own
        backlog[name] = backlog.get(name, 0) + tokens
        own[name] = own.get(name, 0) + tokens
        if self._changed is not None:
            self._changed.add(name)
            self.sync_dirty()
        state.put(self._key, (name, tokens))

    def _release_pending(self, state: CycleState, pending: _Pending) -> None:
        state.put(self._key, None)  # released: once
        name, tokens = pending
        subtract(self._backlog, name, tokens)
        subtract(self._own, name, tokens)
        if self._changed is not None:
            self._changed.add(name)
            self.sync_dirty()

    # ResponseBodyProcessor: the first byte means the prefill is done ----------------------
    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None:
        """Called per chunk; after the first it finds its request released (None)."""
        if chunk or response.end_of_stream:
            pending = state.get(self._key)
            if pending is not None:
                self._release_pending(state, pending)

    # ResponseCompleteProcessor: release on any end, normal or not --------------------------
    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        pending = state.get(self._key)  # usually released at the first byte
        if pending is not None:
            self._release_pending(state, pending)

    # EndpointObserver ------------------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        return None

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._backlog.pop(endpoint.name, None)
        self._own.pop(endpoint.name, None)
        self._reported.discard(endpoint.name)
        self._peers.discard_key(endpoint.name)

    # Replicated ------------------------------------------------------------------------
    @property
    def sync_key(self) -> str:
        return f"{self.TYPE}/{self.typed_name.name}"

    def drain(self) -> list[Any]:
        """``[name, tokens]``: own absolute backlog of the endpoints changed since the last call."""
        changed, self._changed = self._changed, set()
        if not changed:
            return []
        self._reported |= changed
        own = self._own
        return [[name, own.get(name, 0)] for name in changed]

    def resend(self) -> None:
        """Mark every endpoint a drain ever named (zeros too: a lost release) and every own backlog
        changed, so the next ``drain`` carries it all: a peer that lost a batch of ours takes the
        whole picture again (the hub's resync)."""
        if self._changed is not None:
            self._changed.update(self._reported)
            self._changed.update(self._own)

    def apply(self, origin: str, deltas: Any) -> None:
        """Replace ``origin``'s backlog on the endpoints ``deltas`` names; a ValueError changes nothing.

        ``deltas`` is checked here, not by its annotation: compiled (mypyc), a ``list`` annotation
        would fail a peer's malformed message with TypeError before the check.
        """
        self._peers.apply(origin, _parse_backlog(deltas, "prefill-load deltas"))

    def forget(self, origin: str) -> None:
        """Drop ``origin``'s backlog (and any a snapshot restored: it is as stale)."""
        self._peers.forget(origin)

    def _peer_changed(self, name: str, new: int, old: int) -> None:
        """An origin's backlog on ``name`` went from ``old`` to ``new``: the total follows."""
        if new > old:
            self._backlog[name] = self._backlog.get(name, 0) + new - old
        else:
            subtract(self._backlog, name, old - new)

    def snapshot(self) -> dict[str, Any]:
        return {"own": dict(self._own), "peers": self._peers.peers()}

    def restore(self, snapshot: Any) -> None:
        """Adopt a peer's ``snapshot()``: its peers' backlog by origin, its own under a placeholder."""
        if not isinstance(snapshot, dict) or not isinstance(snapshot.get("peers"), dict):
            raise ValueError("prefill-load snapshot: expected a map with 'own' and 'peers' maps")  # noqa: TRY004
        maps = [*snapshot["peers"].items(), (SNAPSHOT_ORIGIN, snapshot.get("own"))]
        batches = []
        for origin, counts in maps:  # checked whole before any is applied
            if not isinstance(origin, str) or not isinstance(counts, dict):
                raise ValueError(  # noqa: TRY004 - a bad peer message, as every sync parse error
                    "prefill-load snapshot: 'own' and each peer must map endpoint names to tokens"
                )
            batches.append((origin, _parse_backlog(list(counts.items()), "prefill-load snapshot")))
        self._peers.restore(batches)


def _parse_backlog(deltas: Any, what: str) -> list[tuple[str, int]]:
    """``[[endpoint name, tokens >= 0], ...]``, checked whole before any of it is applied."""
    return parse_rows(
        deltas,
        what,
        2,
        lambda d: isinstance(d[0], str) and type(d[1]) is int and d[1] >= 0,
        "[endpoint name, tokens >= 0]",
        lambda d: (d[0], d[1]),
    )
