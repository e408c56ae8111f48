"""``context-length-aware`` (llm-d-router): send long prompts to pods provisioned for long contexts.

Pods label the prompt lengths they are sized for (``llm-d.ai/context-length-range: "0-2048"``);
the plugin scores, and optionally filters, candidates by how well the request fits: a tight
range that holds it best, a wide one less, one it misses least of all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

import structlog
from pydantic import field_validator

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, prompt_tokens
from epp.scheduling.api import ScorerCategory

log = structlog.get_logger(__name__)

DEFAULT_LABEL: Final = "llm-d.ai/context-length-range"
MAX_FALLBACK_SCORE: Final = 0.3
_MAX_CACHED_RANGES: Final = 1024


def parse_range(text: str) -> tuple[int, int]:
    """``"min-max"`` (integers, min <= max); ValueError otherwise, as upstream's parseContextRange."""
    if not text:
        raise ValueError("empty range string")
    bounds = text.split("-")
    if len(bounds) != 2:
        raise ValueError(f"invalid range format: {text} (expected 'min-max')")
    try:
        lo = int(bounds[0].strip())
    except ValueError:
        raise ValueError(f"invalid min value: {bounds[0]}") from None
    try:
        hi = int(bounds[1].strip())
    except ValueError:
        raise ValueError(f"invalid max value: {bounds[1]}") from None
    if lo > hi:
        raise ValueError(f"min ({lo}) cannot be greater than max ({hi})")
    return lo, hi


def range_score(length: int, lo: int, hi: int) -> float:
    """In range: ``0.3 + 0.7 * (0.7 * width_score + 0.3 * headroom / width)`` with
    ``width_score = 1 / (1 + width / 10000)`` (1.0 for a zero-width range), always above 0.3;
    out of range: ``0.3 / (1 + distance / 1000)``, always below 0.3 (upstream's calculateRangeScore)."""
    if lo <= length <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        width_score = 1.0 / (1.0 + width / 10000.0)
        position = (hi - length) / width
        raw = 0.7 * width_score + 0.3 * position
        return MAX_FALLBACK_SCORE + raw * (1.0 - MAX_FALLBACK_SCORE)
    distance = length - hi if length > hi else lo - length
    return MAX_FALLBACK_SCORE / (1.0 + distance / 1000.0)


class ContextLengthAwareParams(PluginParams):
    label: str = DEFAULT_LABEL
    enable_filtering: bool = False

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        if not v:
            raise ValueError("'label' must be specified")
        return v


class ContextLengthAware(PluginBase):
    """Type ``context-length-aware``: a scorer (category Affinity) and, with ``enableFiltering``, a filter.

    Context length is the request's prompt tokens (``epp.request.prompt_tokens``, the estimate
    every plugin here shares; upstream reads the token producer's count).  Score: no label → 0.5,
    unparsable label → 0.0, else ``range_score``.  Filter (only with ``enableFiltering``): keeps
    unlabelled endpoints and those whose range holds the length; drops unparsable ones.
    Parameters: ``label`` (``llm-d.ai/context-length-range``), ``enableFiltering`` (false).
    """

    TYPE: ClassVar[str] = "context-length-aware"
    PARAMS: ClassVar[type[PluginParams]] = ContextLengthAwareParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True

    def __init__(self, name: str, params: ContextLengthAwareParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.label = params.label
        self.enable_filtering = params.enable_filtering
        self._ranges: dict[str, tuple[int, int] | None] = {}  # label value -> parsed (None: invalid)

    def _range(self, ep: Endpoint, text: str) -> tuple[int, int] | None:
        if text in self._ranges:
            return self._ranges[text]
        try:
            parsed: tuple[int, int] | None = parse_range(text)
        except ValueError as e:
            log.warning(
                "context_range_label_invalid", plugin=self.typed_name.name, endpoint=ep.name, error=str(e)
            )
            parsed = None
        if len(self._ranges) >= _MAX_CACHED_RANGES:
            self._ranges.clear()
        self._ranges[text] = parsed
        return parsed

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not self.enable_filtering:
            return endpoints
        length = prompt_tokens(request)
        kept: list[Endpoint] = []
        for ep in endpoints:
            text = ep.metadata.labels.get(self.label)
            if text is None:
                kept.append(ep)
                continue
            r = self._range(ep, text)
            if r is not None and r[0] <= length <= r[1]:
                kept.append(ep)
        return kept

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        length = prompt_tokens(request)
        scores: list[float] = []
        for ep in endpoints:
            text = ep.metadata.labels.get(self.label)
            if text is None:
                scores.append(0.5)
                continue
            r = self._range(ep, text)
            scores.append(0.0 if r is None else range_score(length, r[0], r[1]))
        return scores
