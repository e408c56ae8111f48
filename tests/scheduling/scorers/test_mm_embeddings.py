"""mm-embeddings-cache-scorer: llm-d-router v0.10's scorer_test.go vectors."""

from __future__ import annotations

import pytest

from epp.datalayer.multimodal import ENCODER_CACHE_MATCH, EncoderCacheMatchInfo, MatchItem
from epp.plugin.state import CycleState
from epp.scheduling.api import ScorerCategory
from epp.scheduling.scorers.mm_embeddings import MmEmbeddingsCacheScorer
from epp.testing.builders import make_endpoint
from epp.testing.plugins import build
from tests.scheduling.builders import request


def test_declares_what_it_reads() -> None:
    s = build(MmEmbeddingsCacheScorer, "mm-scorer", producerName="mm")
    assert s.typed_name.name == "mm-scorer" and s.producer_name == "mm"
    assert ENCODER_CACHE_MATCH in s.CONSUMES
    assert s.CATEGORY is ScorerCategory.AFFINITY
    assert ENCODER_CACHE_MATCH.default_producer == "mm-embeddings-cache-producer"


def test_score_is_matched_size_over_request_size() -> None:
    a, b, c = (make_endpoint(i) for i in range(3))
    image, icon = MatchItem("image", 80, ""), MatchItem("icon", 20, "")
    items = (image, icon)
    state = CycleState()
    state.put_attribute(ENCODER_CACHE_MATCH, a, EncoderCacheMatchInfo((image,), items))
    state.put_attribute(ENCODER_CACHE_MATCH, b, EncoderCacheMatchInfo((icon,), items))
    state.put_attribute(ENCODER_CACHE_MATCH, c, EncoderCacheMatchInfo((), items))
    scores = build(MmEmbeddingsCacheScorer).score(state, request(), [a, b, c])
    assert list(scores) == pytest.approx([0.8, 0.2, 0.0])


def test_missing_or_empty_match_scores_zero() -> None:
    a, b = make_endpoint(0), make_endpoint(1)
    scorer = build(MmEmbeddingsCacheScorer)
    assert list(scorer.score(CycleState(), request(), [a, b])) == [0.0, 0.0]  # no producer ran
    state = CycleState()
    state.put_attribute(ENCODER_CACHE_MATCH, b, EncoderCacheMatchInfo((MatchItem("image", 1, ""),), ()))
    assert list(scorer.score(state, request(), [a, b])) == [0.0, 0.0]  # a zero request size
