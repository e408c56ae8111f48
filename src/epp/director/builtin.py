"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.director.admitters.latency_slo import LatencySloAdmitter
from epp.director.admitters.probabilistic import ProbabilisticAdmitter
from epp.director.producers.approx_prefix import (
    ApproxPrefixCacheProducer,
    MulticlusterApproxPrefixCacheProducer,
)
from epp.director.producers.burst_prefix import BurstPrefixCacheProducer
from epp.director.producers.inflight_load import InFlightLoadProducer
from epp.director.producers.mm_embeddings import MmEmbeddingsCacheProducer
from epp.director.producers.p2p_source import P2PSourceProducer
from epp.director.producers.precise_prefix import PrecisePrefixCacheProducer
from epp.director.producers.predicted_latency import PredictedLatencyProducer
from epp.director.producers.session_id import SessionIdProducer
from epp.director.producers.token_producer import LegacyTokenizer, TokenProducer
from epp.director.reporters.attribute_reporter import RequestAttributeReporter
from epp.director.reporters.served_verifier import DestinationEndpointServedVerifier
from epp.director.requestheader.agent_identity import AgentIdentity
from epp.director.screeners.disaggregated_rollout import DisaggregatedSetRolloutScreener
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (
    ApproxPrefixCacheProducer,
    MulticlusterApproxPrefixCacheProducer,
    P2PSourceProducer,
    InFlightLoadProducer,
    RequestAttributeReporter,
    DestinationEndpointServedVerifier,
    PredictedLatencyProducer,
    LatencySloAdmitter,
    TokenProducer,  # llm-d-router's: estimate, vllm render, UDS, local/hf tokenizer.json
    LegacyTokenizer,  # its older type name `tokenizer`, with a deprecation warning
    ProbabilisticAdmitter,
    PrecisePrefixCacheProducer,
    SessionIdProducer,
    BurstPrefixCacheProducer,
    MmEmbeddingsCacheProducer,
    AgentIdentity,  # llm-d-router's request-header plugin: agent session → fairness id
    DisaggregatedSetRolloutScreener,  # llm-d-router's screener: one DisaggregatedSet revision per request
)
