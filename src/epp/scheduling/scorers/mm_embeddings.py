"""``mm-embeddings-cache-scorer`` (llm-d-router v0.10): prefer endpoints that encoded this request's media."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.multimodal import ENCODER_CACHE_MATCH
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import ScorerCategory


class MmEmbeddingsScorerParams(PluginParams):
    producer_name: str = ""  # which producer instance's match to read; this EPP keeps one a request


class MmEmbeddingsCacheScorer(PluginBase):
    """Type ``mm-embeddings-cache-scorer``, category Affinity.

    score = the size of the request's media items the endpoint holds / the size of all of them
    (each item weighs 1: the share of the request's unique images, videos and audio clips the
    endpoint recently encoded), from ``mm-embeddings-cache-producer``'s ``ENCODER_CACHE_MATCH``;
    0 without it (no media, or no producer ran).  The producer is added when none is configured.
    Parameters: ``producerName`` (accepted: the one producer's match is read whatever it names).
    """

    TYPE: ClassVar[str] = "mm-embeddings-cache-scorer"
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY
    BOUNDED: ClassVar[bool] = True  # scores always in [0, 1]
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({ENCODER_CACHE_MATCH})
    PARAMS: ClassVar[type[PluginParams]] = MmEmbeddingsScorerParams

    def __init__(self, name: str, params: MmEmbeddingsScorerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.producer_name = params.producer_name

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        infos = state.attributes(ENCODER_CACHE_MATCH)
        if not infos:
            return [0.0] * len(endpoints)
        out: list[float] = []
        for info in map(infos.get, endpoints):
            total = info.request_size if info is not None else 0
            out.append(info.matched_size / total if info is not None and total > 0 else 0.0)
        return out
