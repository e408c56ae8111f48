"""``concurrency-detector``: pool saturation from the requests or tokens the EPP has in flight."""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD, InFlightLoad
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, estimate_tokens

DEFAULT_MAX_CONCURRENCY: Final = 100
DEFAULT_MAX_TOKEN_CONCURRENCY: Final = 1_000_000


class ConcurrencyMode(enum.StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"


@runtime_checkable
class InFlightLoadSource(Protocol):
    """A plugin that tracks in-flight load per endpoint outside any request (e.g. the
    ``inflight-load-producer``).  The detector finds one among the configured plugins to
    compute pool saturation, which has no per-request CycleState to read from."""

    def inflight_load(self, endpoint: Endpoint) -> InFlightLoad | None: ...


class ConcurrencyDetectorParams(PluginParams):
    """GIE's names and defaults."""

    concurrency_mode: str = ConcurrencyMode.REQUESTS.value
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_token_concurrency: int = DEFAULT_MAX_TOKEN_CONCURRENCY
    headroom: float = 0.0


_UNSET: Final[Any] = object()


class ConcurrencyDetector(PluginBase):
    """Saturation from in-flight load; also a scheduling filter.  Type ``concurrency-detector``.

    In ``requests`` mode the load of an endpoint is its in-flight request count and its
    capacity ``maxConcurrency``; in ``tokens`` mode, in-flight tokens and
    ``maxTokenConcurrency``.  Saturation = total load / total capacity over the given
    endpoints (no endpoints → 1.0); flow control adds the requests it dispatched that no
    endpoint counts yet (``saturation_with_transit``; GIE does not, so a burst passes whole).
    As a filter it keeps endpoints with ``load < int(capacity * (1 + headroom))`` (no
    fail-open, as in GIE).

    Where the load comes from: the filter reads ``INFLIGHT_LOAD`` from the request's
    CycleState (written by the ``inflight-load-producer``, auto-created because this
    plugin consumes the key).  ``saturation()`` runs outside any request, where GIE reads
    attributes that are never set on datastore endpoints and so always sees 0 load
    (gie-inventory Appendix A #7).  Here it asks the first configured plugin that
    implements ``InFlightLoadSource`` (``inflight_load(endpoint)``); with none, the load
    is 0, as in GIE.  The filter also falls back to that source when the CycleState has no
    ``INFLIGHT_LOAD``.  With active-active replicas both read the pool's load, not this
    replica's share: the ``inflight-load-producer`` adds its peers' counts to its own.
    Parameters: ``concurrencyMode`` (``requests`` | ``tokens``), ``maxConcurrency`` (100,
    > 0), ``maxTokenConcurrency`` (1000000, > 0), ``headroom`` (0.0, >= 0).
    """

    TYPE: ClassVar[str] = "concurrency-detector"
    PARAMS: ClassVar[type[PluginParams]] = ConcurrencyDetectorParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({INFLIGHT_LOAD})

    def __init__(self, name: str, params: ConcurrencyDetectorParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        errs: list[str] = []
        if params.max_concurrency <= 0:
            errs.append(f"maxConcurrency must be strictly positive, got {params.max_concurrency}")
        if params.headroom < 0.0:
            errs.append(f"headroom must be a non-negative value, got {params.headroom:f}")
        if params.max_token_concurrency <= 0:
            errs.append(f"maxTokenConcurrency must be strictly positive, got {params.max_token_concurrency}")
        if params.concurrency_mode not in (ConcurrencyMode.REQUESTS, ConcurrencyMode.TOKENS):
            errs.append(f'unsupported concurrencyMode: "{params.concurrency_mode}"')
        if errs:
            raise ConfigError("invalid concurrency detector configuration: " + "; ".join(errs))
        self.mode = ConcurrencyMode(params.concurrency_mode)
        self.tokens = self.mode is ConcurrencyMode.TOKENS
        self.capacity = params.max_token_concurrency if self.tokens else params.max_concurrency
        self.limit = int(self.capacity * (1.0 + params.headroom))
        self._handle = handle
        self._source: InFlightLoadSource | None = _UNSET

    def load_source(self) -> InFlightLoadSource | None:
        """The plugin that knows in-flight load outside a request; looked up once, after build."""
        if self._source is _UNSET:
            self._source = next(
                (p for p in self._handle.plugins() if p is not self and isinstance(p, InFlightLoadSource)),
                None,
            )
        return self._source

    def _load(self, load: InFlightLoad | None) -> int:
        if load is None:
            return 0
        return load.tokens if self.tokens else load.requests

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        source = self.load_source()
        if source is None:
            return 0.0
        inflight = sum(self._load(source.inflight_load(ep)) for ep in endpoints)
        return inflight / (self.capacity * len(endpoints))

    def saturation_with_transit(
        self, endpoints: Sequence[Endpoint], transit: Collection[InferenceRequest]
    ) -> float:
        """``saturation`` with the requests flow control let through that no endpoint counts
        yet (``TransitAwareDetector``): each is one request, or its estimated tokens."""
        if not endpoints:
            return 1.0
        if self.load_source() is None:
            return 0.0  # as ``saturation``: with no load source, GIE's reading (always 0)
        pending = sum(estimate_tokens(r) for r in transit) if self.tokens else len(transit)
        return self.saturation(endpoints) + pending / (self.capacity * len(endpoints))

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        loads: Mapping[Any, InFlightLoad] = state.attributes(INFLIGHT_LOAD)
        limit = self.limit
        if loads:
            return [ep for ep in endpoints if self._load(loads.get(ep)) < limit]
        source = self.load_source()
        if source is None:
            return list(endpoints)  # no load known anywhere: 0 < limit for every endpoint
        return [ep for ep in endpoints if self._load(source.inflight_load(ep)) < limit]
