"""The BUILTINS of scheduling, flow control and the prefix producer: GIE type names and parameter names."""

from __future__ import annotations

import pytest

from epp.director.builtin import BUILTINS as DIRECTOR_BUILTINS
from epp.flowcontrol.builtin import BUILTINS as FLOWCONTROL_BUILTINS
from epp.plugin.registry import Registry
from epp.scheduling.builtin import BUILTINS as SCHEDULING_BUILTINS
from epp.testing.plugins import FakeHandle

EXPECTED: dict[str, set[str]] = {
    "single-profile-handler": set(),
    "max-score-picker": {"maxNumOfEndpoints"},
    "random-picker": {"maxNumOfEndpoints"},
    "weighted-random-picker": {"maxNumOfEndpoints"},
    "queue-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "running-requests-size-scorer": set(),
    "lora-affinity-scorer": set(),
    "token-load-scorer": {"queueThresholdTokens"},
    "prefix-cache-scorer": {"prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens"},
    # llm-d-router's (docs/compatibility.md)
    "load-aware-scorer": {"threshold"},
    "data-parallel-profile-handler": {"primaryPort"},
    "context-length-aware": {"label", "enableFiltering"},
    "utilization-filter": {"conditions", "fallbackOnEmpty", "inFlightLoadProducerName"},
    "header-label-affinity-scorer": {"headerName", "labelKey"},
    "header-profile-handler": {"headerName", "defaultProfile"},
    "topology-affinity-filter": {"minAffinity", "topologyProducerName"},
    "topology-affinity-scorer": {"topologyProducerName"},
    "no-hit-lru-scorer": {"prefixPluginType", "prefixPluginName", "lruSize", "prefixMatchInfoProducerName"},
    "prefill-load-scorer": set(),  # ours, not GIE's
    "mm-embeddings-cache-scorer": {"producerName"},
    "endpoint-attribute-filter": {"attribute", "producer", "onMissing", "fallbackOnEmpty", "algorithm"},
    "endpoint-attribute-scorer": {"attributeKey", "producer", "algorithm"},
    # llm-d's name and config blocks, plus ours (docs/precise-prefix.md)
    "precise-prefix-cache-scorer": {
        "approximateWhenUnheld",  # ours
        "tokenProcessorConfig",
        "kvEventsConfig",
        "indexerConfig",
        "tokenizerConfig",
        "scoreNormalization",
        "kvEventsSource",
        # ours: blocks of routed requests the engine has not reported yet (docs/precise-prefix.md)
        "speculativeIndexing",
        "speculativeWeight",
        "speculativeGraceSeconds",
        "speculativeTtlSeconds",
        "speculativeTTL",  # llm-d-router's (a Go duration)
    },
    "prefix-cache-affinity-filter": {
        "affinityThreshold",
        "explorationProbability",
        "maxTTFTPenaltyMs",
        "ttftSource",  # llm-d-router's
        "peakPrefillThroughput",  # llm-d-router's
    },
    "header-based-testing-filter": set(),
    "utilization-detector": {
        "queueDepthThreshold",
        "kvCacheUtilThreshold",
        "metricsStalenessThreshold",
        "headroom",
    },
    "concurrency-detector": {"concurrencyMode", "maxConcurrency", "maxTokenConcurrency", "headroom"},
    "approx-prefix-cache-producer": {
        "autoTune",
        "blockSizeTokens",
        "blockSize",
        "maxPrefixBlocksToMatch",
        "maxPrefixTokensToMatch",
        "lruCapacityPerServer",
    },
    "latency-scorer": {
        "bestEffortTTFTMs",  # ours
        "bestEffortPlacement",  # ours
        "sloReserveEndpoints",  # ours
        "ttftWeight",
        "tpotWeight",
        "headroomSelectionStrategy",
        "compositeKVWeight",
        "compositeQueueWeight",
        "compositePrefixWeight",
    },
    "slo-headroom-tier-filter": {"epsilonExploreNeg"},
    "predicted-latency-producer": {
        "samplingMean",
        "maxDecodeTokenSamplesForPrediction",
        "sloBufferFactor",
        "contextTTL",
        "streamingMode",
        "endpointRoleLabel",
        "predictInPrepareData",
    },
    "latency-slo-admitter": set(),
    # llm-d-router's P/D plugins (docs/pd-disaggregation.md)
    "disagg-profile-handler": {"stageOrder", "profiles", "deciders", "declinedProfile"},
    "pd-profile-handler": {
        "decodeProfile",
        "prefillProfile",
        "prefixPluginType",
        "prefixPluginName",
        "primaryPort",
        "deciderPluginName",
        "prefixMatchInfoProducerName",
    },
    "disagg-headers-handler": {"prefillProfile", "encodeProfile"},
    "prefill-header-handler": {"prefillProfile", "encodeProfile"},
    "prefix-based-pd-decider": {"nonCachedTokens", "promptTokens", "dedicatedDecodeOnly"},
    "always-disagg-pd-decider": set(),
    "always-disagg-multimodal-decider": set(),
    "decode-filter": set(),
    "prefill-filter": set(),
    "encode-filter": set(),
    "exclude-peer-filter": set(),  # ours: keeps prefill off the decode pick (docs/pd-disaggregation.md)
    "label-selector-filter": {"matchLabels", "matchExpressions"},
    "by-label-selector": {"matchLabels", "matchExpressions"},
    "by-label": {"label", "validValues", "allowsNoLabel"},
    "active-request-scorer": {"idleThreshold", "maxBusyScore", "requestTimeout"},
    # llm-d's names, plus skipWhenSaturated and maxSessions (docs/precise-prefix.md, Session affinity)
    "session-affinity-filter": {
        "strategy",
        "profileName",
        "encodedEndpointHeaderConfig",
        "sessionIdConfig",
        "skipWhenSaturated",
    },
    # ours: the health penalty; its parameters are the health policy (docs/health.md)
    "endpoint-health-scorer": {
        "consecutive5xx",
        "consecutiveGatewayFailure",
        "baseEjectionTime",
        "maxEjectionTime",
        "maxEjectionPercent",
        "healthyPanicThreshold",
        "scrapeHangTime",
        "scrapeSlowFactor",
        "noHeadersTime",
        "noHeadersFactor",
        "latencyOutlierFactor",
        "latencyMinSamples",
        "latencyConsecutiveOutliers",
        "basePenaltyTime",
        "maxPenaltyTime",
    },
    "session-affinity-scorer": {
        "algorithm",
        "headerName",
        "profileName",
        "evictionTtlSeconds",
        "evictionSweepSeconds",
        "missThreshold",
        "maxSessions",
        "skipWhenSaturated",
        # llm-d-router v0.10's form (the filter's)
        "strategy",
        "encodedEndpointHeaderConfig",
        "sessionIdConfig",
    },
}
# llm-d-router's multicluster family (the stock parameters) and p2p-source-producer
EXPECTED |= {
    "multicluster-queue-scorer": set(),
    "multicluster-kv-cache-utilization-scorer": set(),
    "multicluster-prefix-cache-scorer": EXPECTED["prefix-cache-scorer"],
    "multicluster-session-affinity-filter": EXPECTED["session-affinity-filter"],
    "p2p-source-producer": {"prefixMatchInfoProducerName", "minCachedTokenDelta", "prefillProfileName"},
    "multicluster-approx-prefix-cache-producer": EXPECTED["approx-prefix-cache-producer"],
}

# Types whose parameters have no valid empty form (llm-d rejects them empty too).
REQUIRED_PARAMETERS: dict[str, dict[str, object]] = {
    "by-label": {"label": "x", "allowsNoLabel": True},
    "utilization-filter": {"conditions": [{"metric": "waiting-queue", "maxValue": 0}]},
    "header-label-affinity-scorer": {"headerName": "x-tier", "labelKey": "tier"},
    "endpoint-attribute-filter": {
        "attribute": "a",
        "algorithm": {"type": "threshold", "threshold": {"operator": "Equal", "value": 0}},
    },
    "endpoint-attribute-scorer": {"attributeKey": "a", "algorithm": {"type": "linear_lower_is_better"}},
}

# Other concepts' plugins share the flow-control and director tuples; keep only these.
_MINE = (
    *SCHEDULING_BUILTINS,
    *(c for c in (*FLOWCONTROL_BUILTINS, *DIRECTOR_BUILTINS) if c.TYPE in EXPECTED),
)


def test_every_type_registered_once() -> None:
    """Exactly GIE's type strings (plus our prefill-load-scorer), no duplicates across the three tuples."""
    reg = Registry(_MINE)
    assert set(reg.types()) == set(EXPECTED)
    assert len(_MINE) == len(EXPECTED)


@pytest.mark.parametrize("cls", [pytest.param(c, id=c.TYPE) for c in _MINE])
def test_parameter_names_and_defaults(cls: type) -> None:
    """YAML parameter names are GIE's camelCase; every plugin builds with no parameters (or its required ones)."""
    aliases = {f.alias or n for n, f in cls.PARAMS.model_fields.items()}  # type: ignore[attr-defined]
    assert aliases == EXPECTED[cls.TYPE]  # type: ignore[attr-defined]
    plugin = Registry([cls]).build(
        name="p",
        type_name=cls.TYPE,  # type: ignore[attr-defined]
        parameters=REQUIRED_PARAMETERS.get(cls.TYPE),  # type: ignore[attr-defined]
        handle=FakeHandle(),
        path="plugins[0]",
    )
    assert plugin.typed_name.type == cls.TYPE  # type: ignore[attr-defined]
    assert plugin.typed_name.name == "p"
