"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.plugin.base import Plugin
from epp.scheduling.filters.by_label import (
    ByLabelFilter,
    ByLabelSelectorFilter,
    DecodeFilter,
    EncodeFilter,
    LabelSelectorFilter,
    PrefillFilter,
)
from epp.scheduling.filters.endpoint_attribute import EndpointAttributeFilter
from epp.scheduling.filters.header_testing import HeaderBasedTestingFilter
from epp.scheduling.filters.multicluster import MultiClusterSessionAffinityFilter
from epp.scheduling.filters.peer import ExcludePeerFilter
from epp.scheduling.filters.prefix_affinity import PrefixCacheAffinityFilter
from epp.scheduling.filters.session_affinity import SessionAffinityFilter
from epp.scheduling.filters.slo_headroom_tier import SloHeadroomTierFilter
from epp.scheduling.filters.topology_affinity import TopologyAffinityFilter
from epp.scheduling.filters.utilization import UtilizationFilter
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.random import RandomPicker
from epp.scheduling.pickers.weighted_random import WeightedRandomPicker
from epp.scheduling.profiles.data_parallel import DataParallelProfileHandler
from epp.scheduling.profiles.deciders import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
    PrefixBasedPDDecider,
)
from epp.scheduling.profiles.disagg import DisaggProfileHandler
from epp.scheduling.profiles.disagg_deprecated import (
    DisaggHeadersHandler,
    PdProfileHandler,
    PrefillHeaderHandler,
)
from epp.scheduling.profiles.header_profile import HeaderProfileHandler
from epp.scheduling.profiles.single import SingleProfileHandler
from epp.scheduling.scorers.active_request import ActiveRequestScorer
from epp.scheduling.scorers.context_length_aware import ContextLengthAware
from epp.scheduling.scorers.endpoint_attribute import EndpointAttributeScorer
from epp.scheduling.scorers.header_label_affinity import HeaderLabelAffinityScorer
from epp.scheduling.scorers.health import EndpointHealthScorer
from epp.scheduling.scorers.kv_cache import KVCacheUtilizationScorer
from epp.scheduling.scorers.latency import LatencyScorer
from epp.scheduling.scorers.load_aware import LoadAwareScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.scheduling.scorers.mm_embeddings import MmEmbeddingsCacheScorer
from epp.scheduling.scorers.multicluster import (
    MultiClusterKVCacheUtilizationScorer,
    MultiClusterPrefixCacheScorer,
    MultiClusterQueueScorer,
)
from epp.scheduling.scorers.no_hit_lru import NoHitLruScorer
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
from epp.scheduling.scorers.prefill_load import PrefillLoadScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsSizeScorer
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.scorers.token_load import TokenLoadScorer
from epp.scheduling.scorers.topology_affinity import TopologyAffinityScorer

BUILTINS: Final[tuple[type[Plugin], ...]] = (
    # llm-d-router's multicluster family (cluster endpoints; scorers/multicluster.py)
    MultiClusterQueueScorer,
    MultiClusterKVCacheUtilizationScorer,
    MultiClusterPrefixCacheScorer,
    MultiClusterSessionAffinityFilter,
    SingleProfileHandler,
    MaxScorePicker,
    RandomPicker,
    WeightedRandomPicker,
    QueueScorer,
    KVCacheUtilizationScorer,
    RunningRequestsSizeScorer,
    LoraAffinityScorer,
    TokenLoadScorer,
    PrefixCacheScorer,
    PrecisePrefixCacheScorer,
    PrefillLoadScorer,
    PrefixCacheAffinityFilter,
    HeaderBasedTestingFilter,
    LatencyScorer,
    SloHeadroomTierFilter,
    # P/D disaggregation (llm-d-router)
    DisaggProfileHandler,
    PdProfileHandler,
    DisaggHeadersHandler,
    PrefillHeaderHandler,
    PrefixBasedPDDecider,
    AlwaysDisaggPDDecider,
    AlwaysDisaggMultimodalDecider,
    DecodeFilter,
    PrefillFilter,
    EncodeFilter,
    ExcludePeerFilter,
    LabelSelectorFilter,
    ByLabelSelectorFilter,
    ByLabelFilter,
    ActiveRequestScorer,
    SessionAffinityFilter,
    SessionAffinityScorer,
    LoadAwareScorer,
    NoHitLruScorer,
    TopologyAffinityFilter,
    TopologyAffinityScorer,
    DataParallelProfileHandler,
    ContextLengthAware,
    UtilizationFilter,
    HeaderLabelAffinityScorer,
    HeaderProfileHandler,
    EndpointHealthScorer,
    MmEmbeddingsCacheScorer,
    EndpointAttributeFilter,
    EndpointAttributeScorer,
)
