"""``token-load-scorer``: prefer endpoints with fewer in-flight tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import INFLIGHT_LOAD
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory

DEFAULT_QUEUE_THRESHOLD_TOKENS: Final = 4194304  # 128 requests of 32k tokens


class TokenLoadParams(PluginParams):
    """``queueThresholdTokens``: in-flight tokens at which an endpoint scores 0 (``<= 0``: default)."""

    queue_threshold_tokens: int = DEFAULT_QUEUE_THRESHOLD_TOKENS


class TokenLoadScorer(PluginBase):
    """Prefer few in-flight tokens.  Type ``token-load-scorer``, category Distribution.

    With ``t`` = the endpoint's ``InFlightLoad.tokens`` and ``T = queueThresholdTokens``:
    ``t <= 0`` (or no load recorded) → 1.0, else ``1 - min(t, T) / T``.
    Consumes: ``INFLIGHT_LOAD`` (auto-creates ``inflight-load-producer``).
    Parameters: ``queueThresholdTokens`` (default 4194304; ``<= 0`` means the default).
    """

    TYPE: ClassVar[str] = "token-load-scorer"
    PARAMS: ClassVar[type[PluginParams]] = TokenLoadParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]: the profile skips its range check
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({INFLIGHT_LOAD})

    def __init__(self, name: str, params: TokenLoadParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        t = params.queue_threshold_tokens
        self.queue_threshold_tokens = float(t if t > 0 else DEFAULT_QUEUE_THRESHOLD_TOKENS)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        loads = state.attributes(INFLIGHT_LOAD)
        if not loads:
            return [1.0] * len(endpoints)
        cap = self.queue_threshold_tokens
        get = loads.get
        out: list[float] = []
        append = out.append
        for ep in endpoints:  # a plain loop: a ``map`` object costs ~1.6k instructions to make
            load = get(ep)
            t = 0 if load is None else load.tokens
            # ``min(t, cap)`` without the builtin call: the same value (t == cap: both 1.0)
            append(1.0 if t <= 0 else 1.0 - (t if t < cap else cap) / cap)
        return out
