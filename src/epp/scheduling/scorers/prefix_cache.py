"""``prefix-cache-scorer``: prefer endpoints believed to hold the request's prompt prefix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PREFIX_MATCH
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory

DEFAULT_MATCH_LENGTH_SCALE_TOKENS: Final = 8192


class PrefixCacheScorerParams(PluginParams):
    """llm-d-router's parameters (v0.10).  GIE <= 1.4's index parameters are moved to the
    producer by ``epp.config.load`` before this model sees them (docs/compatibility.md)."""

    prefix_match_info_producer_name: str = ""
    match_length_weight: float = 0.0
    match_length_scale_tokens: int = DEFAULT_MATCH_LENGTH_SCALE_TOKENS


class PrefixCacheScorer(PluginBase):
    """Prefer cached prefixes.  Type ``prefix-cache-scorer``, category Affinity.

    score = ``match_blocks / total_blocks`` of the endpoint's ``PrefixMatchInfo``; 0 when
    the info is missing or the prompt has no blocks.  The block hashing and the index live
    in the producer (``approx-prefix-cache-producer``), which is auto-created when no
    configured plugin produces ``PREFIX_MATCH``.
    With llm-d-router's ``matchLengthWeight`` ``w`` > 0 the score also rewards long matches:
    ``w * min(1, match_blocks * block_size_tokens / matchLengthScaleTokens)**2 + (1 - w) * ratio``.
    Consumes: ``PREFIX_MATCH``.  Parameters: ``matchLengthWeight`` (0, in [0, 1]),
    ``matchLengthScaleTokens`` (8192, > 0 when the weight is), ``prefixMatchInfoProducerName``
    (which producer's match to read; this EPP keeps one ``PREFIX_MATCH`` per cycle, written by
    whichever producer is configured, so the name is accepted and informational).
    """

    TYPE: ClassVar[str] = "prefix-cache-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]: the profile skips its range check
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    PARAMS: ClassVar[type[PluginParams]] = PrefixCacheScorerParams

    def __init__(self, name: str, params: PrefixCacheScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        weight = params.match_length_weight
        if not 0.0 <= weight <= 1.0:
            raise ConfigError(f"matchLengthWeight must be between 0.0 and 1.0, got {weight}")
        if weight > 0.0 and params.match_length_scale_tokens <= 0:
            raise ConfigError(
                "matchLengthScaleTokens must be greater than 0 when matchLengthWeight is greater than 0, "
                f"got {params.match_length_scale_tokens}"
            )
        self.match_length_weight = weight
        self.match_length_scale_tokens = params.match_length_scale_tokens
        self.producer_name = params.prefix_match_info_producer_name

    def _length_scores(self, state: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        """llm-d-router's blend of match ratio and squared, capped match length."""
        infos = state.attributes(PREFIX_MATCH)
        w, scale = self.match_length_weight, float(self.match_length_scale_tokens)
        out: list[float] = []
        for info in map(infos.get, endpoints):
            if info is None or info.total_blocks <= 0:
                out.append(0.0)
                continue
            ratio = info.match_blocks / info.total_blocks
            length = 0.0
            if info.block_size_tokens > 0:
                norm = min(1.0, info.match_blocks * info.block_size_tokens / scale)
                length = norm * norm
            out.append(w * length + (1.0 - w) * ratio)
        return out

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        if self.match_length_weight > 0.0:
            return self._length_scores(state, endpoints)
        infos = state.attributes(PREFIX_MATCH)
        if not infos:
            return [0.0] * len(endpoints)
        return [
            info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0
            for info in map(infos.get, endpoints)
        ]

    def add_weighted_scores(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        totals: Sequence[float] | None,
        weight: float,
    ) -> list[float]:
        """``score`` times ``weight`` added into ``totals`` in the same pass (the profile's fast path).

        The producer gives every endpoint without a match one shared info object, so the
        weighted score of that object is computed once and the pass only tests identity
        for most endpoints; the float operations, hence the totals, are those of ``score``.
        """
        if self.match_length_weight > 0.0:
            scores = self._length_scores(state, endpoints)
            if totals is None:
                return [s * weight for s in scores]
            return [t + s * weight for t, s in zip(totals, scores, strict=True)]
        infos = state.attributes(PREFIX_MATCH)
        n = len(endpoints)
        if not infos:
            zero = 0.0 * weight
            return [zero] * n if totals is None else [t + zero for t in totals]
        get = infos.get
        common = get(endpoints[0])
        if common is not None and common.match_blocks and n > 1:
            common = get(endpoints[-1])  # the first endpoint matched: probe the last one instead
        if common is None:
            c = 0.0 * weight
        else:
            c = (common.match_blocks / common.total_blocks if common.total_blocks > 0 else 0.0) * weight
        # Plain loops: ``map`` and ``zip`` objects cost ~1.6k and ~2.4k instructions to make
        # (``strict=True`` ~1.5k more), as much as the pass over four endpoints itself.
        out: list[float] = []
        append = out.append
        if totals is None:
            for ep in endpoints:
                info = get(ep)
                if info is common:
                    append(c)
                else:
                    append(
                        (
                            info.match_blocks / info.total_blocks
                            if info is not None and info.total_blocks > 0
                            else 0.0
                        )
                        * weight
                    )
            return out
        i = 0
        for ep in endpoints:
            info = get(ep)
            if info is common:
                append(totals[i] + c)
            else:
                append(
                    totals[i]
                    + (
                        info.match_blocks / info.total_blocks
                        if info is not None and info.total_blocks > 0
                        else 0.0
                    )
                    * weight
                )
            i += 1
        if i != len(totals):
            raise ValueError(f"{len(totals)} totals for {i} endpoints")
        return out
