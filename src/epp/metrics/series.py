"""GIE's request, pool and flow-control metrics, with names, labels and buckets verbatim (gie-inventory §9.1).

This module also owns ``REGISTRY`` (ours, not prometheus_client's global one), where every
series of the EPP lives, so the exporter serves exactly the EPP's metrics plus the
process/platform collectors. Not every series is declared here: the concepts that own a metric
GIE lacks declare it beside their code, in the same registry — the KV-event subscriber and the
precise prefix scorer (``datalayer/kvevents/metrics.py``), P/D decisions (``metrics/disagg.py``)
and the per-endpoint pool gauges (``datalayer/pool_metrics.py``). ``metrics/llmd.py`` derives
llm-d-router's ``llm_d_epp_*`` twins from all of them at scrape time. The metric classes are the
lock-free ones of ``epp.metrics.fast``: this module is on every request.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from epp.metrics.fast import Counter, Gauge, Histogram

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

GENERAL_LATENCY_BUCKETS: Final = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TPOT_BUCKETS: Final = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8,
    1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
PREDICTION_BUCKETS: Final = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
FAST_BUCKETS: Final = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
TOKEN_BUCKETS: Final = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
    524288, 1048576,
)  # fmt: skip
REQUEST_SIZE_BUCKETS: Final = tuple(float(64 << i) for i in range(25))  # 64 .. 1073741824
RESPONSE_SIZE_BUCKETS: Final = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
OUTPUT_TOKEN_BUCKETS: Final = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NTPOT_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
FC_QUEUE_DURATION_BUCKETS: Final = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip
PREFIX_HIT_RATIO_BUCKETS: Final = tuple(i / 10 for i in range(11))
PREFIX_HIT_BYTES_BUCKETS: Final = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

_MODEL = ("model_name", "target_model_name")


def _h(text: str) -> str:
    return f"[ALPHA] {text}"


# --- inference_objective_* (per request) ------------------------------------------
REQUEST_TOTAL: Final = Counter(
    "inference_objective_request", _h("Counter of inference objective requests broken out for each model and target model."),
    (*_MODEL, "priority"), registry=REGISTRY,
)  # fmt: skip
REQUEST_ERROR_TOTAL: Final = Counter(
    "inference_objective_request_error", _h("Counter of inference objective requests errors broken out for each model and target model."),
    (*_MODEL, "error_code", "reason"), registry=REGISTRY,
)  # fmt: skip
REQUEST_DURATION: Final = Histogram(
    "inference_objective_request_duration_seconds", _h("Inference objective response latency distribution in seconds for each model and target model."),
    _MODEL, buckets=GENERAL_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
REQUEST_SIZES: Final = Histogram(
    "inference_objective_request_sizes", _h("Inference objective requests size distribution in bytes for each model and target model."),
    _MODEL, buckets=REQUEST_SIZE_BUCKETS, registry=REGISTRY,
)  # fmt: skip
RESPONSE_SIZES: Final = Histogram(
    "inference_objective_response_sizes", _h("Inference objective responses size distribution in bytes for each model and target model."),
    _MODEL, buckets=RESPONSE_SIZE_BUCKETS, registry=REGISTRY,
)  # fmt: skip
INPUT_TOKENS: Final = Histogram(
    "inference_objective_input_tokens", _h("Inference objective input token count distribution for requests in each model."),
    _MODEL, buckets=TOKEN_BUCKETS, registry=REGISTRY,
)  # fmt: skip
OUTPUT_TOKENS: Final = Histogram(
    "inference_objective_output_tokens", _h("Inference objective output token count distribution for requests in each model."),
    _MODEL, buckets=OUTPUT_TOKEN_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PROMPT_CACHED_TOKENS: Final = Histogram(
    "inference_objective_prompt_cached_tokens", _h("Inference objective prompt cached token count distribution for requests in each model."),
    _MODEL, buckets=TOKEN_BUCKETS, registry=REGISTRY,
)  # fmt: skip
RUNNING_REQUESTS: Final = Gauge(
    "inference_objective_running_requests", _h("Inference objective number of running requests in each model."),
    ("model_name",), registry=REGISTRY,
)  # fmt: skip
NORMALIZED_TPOT: Final = Histogram(
    "inference_objective_normalized_time_per_output_token_seconds", _h("Inference objective latency divided by number of output tokens in seconds for each model and target model."),
    _MODEL, buckets=NTPOT_BUCKETS, registry=REGISTRY,
)  # fmt: skip
REQUEST_TTFT: Final = Histogram(
    "inference_objective_request_ttft_seconds", _h("Inference model TTFT distribution in seconds for each model and target model."),
    _MODEL, buckets=GENERAL_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
REQUEST_PREDICTED_TTFT: Final = Histogram(
    "inference_objective_request_predicted_ttft_seconds", _h("Inference model Predicted TTFT distribution in seconds for each model and target model."),
    _MODEL, buckets=GENERAL_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
REQUEST_TPOT: Final = Histogram(
    "inference_objective_request_tpot_seconds", _h("Inference model TPOT distribution in seconds for each model and target model."),
    _MODEL, buckets=TPOT_BUCKETS, registry=REGISTRY,
)  # fmt: skip
REQUEST_PREDICTED_TPOT: Final = Histogram(
    "inference_objective_request_predicted_tpot_seconds", _h("Inference model Predicted TPOT distribution in seconds for each model and target model."),
    _MODEL, buckets=TPOT_BUCKETS, registry=REGISTRY,
)  # fmt: skip
TTFT_PREDICTION_DURATION: Final = Histogram(
    "inference_objective_request_ttft_prediction_duration_seconds", _h("Duration taken to generate TTFT predictions in seconds for each model and target model."),
    _MODEL, buckets=PREDICTION_BUCKETS, registry=REGISTRY,
)  # fmt: skip
TPOT_PREDICTION_DURATION: Final = Histogram(
    "inference_objective_request_tpot_prediction_duration_seconds", _h("Duration taken to generate TPOT predictions in seconds for each model and target model."),
    _MODEL, buckets=PREDICTION_BUCKETS, registry=REGISTRY,
)  # fmt: skip
SLO_VIOLATION_TOTAL: Final = Counter(
    "inference_objective_request_slo_violation", _h("Counter of SLO violations for each model, target model, and violation type."),
    (*_MODEL, "type"), registry=REGISTRY,
)  # fmt: skip
INFERENCE_REQUEST_METRIC: Final = Gauge(
    "inference_objective_inference_request_metric", _h("Consolidated gauge for inference request metrics."),
    (*_MODEL, "type"), registry=REGISTRY,
)  # fmt: skip

# --- inference_pool_* (refreshed every --refresh-prometheus-metrics-interval) ------------
POOL_AVG_KV_CACHE: Final = Gauge(
    "inference_pool_average_kv_cache_utilization", _h("The average kv cache utilization for an inference server pool."),
    ("name",), registry=REGISTRY,
)  # fmt: skip
POOL_AVG_QUEUE: Final = Gauge(
    "inference_pool_average_queue_size", _h("The average number of requests pending in the model server queue."),
    ("name",), registry=REGISTRY,
)  # fmt: skip
POOL_AVG_RUNNING: Final = Gauge(
    "inference_pool_average_running_requests", _h("The average number of running requests in the model server."),
    ("name",), registry=REGISTRY,
)  # fmt: skip
POOL_READY_PODS: Final = Gauge(
    "inference_pool_ready_pods", _h("The number of ready pods in the inference server pool."),
    ("name",), registry=REGISTRY,
)  # fmt: skip
# inference_pool_per_pod_queue_size is a custom collector owned by the data layer.

# --- inference_extension_* -----------------------------------------------------
SCHEDULER_E2E_DURATION: Final = Histogram(
    "inference_extension_scheduler_e2e_duration_seconds", _h("End-to-end scheduling latency distribution in seconds."),
    buckets=FAST_BUCKETS, registry=REGISTRY,
)  # fmt: skip
SCHEDULER_ATTEMPTS_TOTAL: Final = Counter(
    "inference_extension_scheduler_attempts", _h("Total number of scheduling attempts."),
    ("status", "target_model_name", "pod_name", "namespace", "port"), registry=REGISTRY,
)  # fmt: skip
PLUGIN_DURATION: Final = Histogram(
    "inference_extension_plugin_duration_seconds", _h("Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name."),
    ("extension_point", "plugin_type", "plugin_name"), buckets=FAST_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PREFIX_INDEXER_SIZE: Final = Gauge(
    "inference_extension_prefix_indexer_size", _h("Size of the prefix indexer."), registry=REGISTRY,
)  # fmt: skip
PREFIX_INDEXER_HIT_RATIO: Final = Histogram(
    "inference_extension_prefix_indexer_hit_ratio", _h("Ratio of prefix length matched to total prefix length in the cache lookup."),
    buckets=PREFIX_HIT_RATIO_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PREFIX_INDEXER_HIT_BYTES: Final = Histogram(
    "inference_extension_prefix_indexer_hit_bytes", _h("Length of the prefix match in number of bytes in the cache lookup."),
    buckets=PREFIX_HIT_BYTES_BUCKETS, registry=REGISTRY,
)  # fmt: skip
INFO: Final = Gauge(
    "inference_extension_info", _h("General information of the current build of Inference Extension."),
    ("commit", "build_ref"), registry=REGISTRY,
)  # fmt: skip
FC_QUEUE_DURATION: Final = Histogram(
    "inference_extension_flow_control_request_queue_duration_seconds", _h("Distribution of the total time requests spend in the EPP flow control layer."),
    ("fairness_id", "priority", "outcome", "inference_pool", *_MODEL), buckets=FC_QUEUE_DURATION_BUCKETS, registry=REGISTRY,
)  # fmt: skip
FC_DISPATCH_CYCLE_DURATION: Final = Histogram(
    "inference_extension_flow_control_dispatch_cycle_duration_seconds", _h("Distribution of the time taken for each dispatch cycle in the EPP flow control layer."),
    buckets=FAST_BUCKETS, registry=REGISTRY,
)  # fmt: skip
FC_ENQUEUE_DURATION: Final = Histogram(
    "inference_extension_flow_control_request_enqueue_duration_seconds", _h("Distribution of the time taken to enqueue requests by the EPP flow control layer."),
    ("fairness_id", "priority", "outcome"), buckets=FAST_BUCKETS, registry=REGISTRY,
)  # fmt: skip
FC_QUEUE_SIZE: Final = Gauge(
    "inference_extension_flow_control_queue_size", _h("Current number of requests being actively managed by the EPP flow control layer."),
    ("fairness_id", "priority", "inference_pool", *_MODEL), registry=REGISTRY,
)  # fmt: skip
FC_QUEUE_BYTES: Final = Gauge(
    "inference_extension_flow_control_queue_bytes", _h("Current size in bytes of all requests being actively managed by the EPP flow control layer."),
    ("fairness_id", "priority", "inference_pool", *_MODEL), registry=REGISTRY,
)  # fmt: skip
FC_POOL_SATURATION: Final = Gauge(
    "inference_extension_flow_control_pool_saturation", _h("Current saturation level of the inference pool as seen by flow control."),
    ("inference_pool",), registry=REGISTRY,
)  # fmt: skip
MODEL_REWRITE_DECISIONS_TOTAL: Final = Counter(
    "inference_extension_model_rewrite_decisions", _h("Total number of model rewrite decisions."),
    ("model_rewrite_name", "model_name", "target_model"), registry=REGISTRY,
)  # fmt: skip

# --- ours (not GIE's): the in-process latency model's accuracy -----------------------
PREDICTION_ERROR_BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10)
LATENCY_PREDICTION_ERROR: Final = Histogram(
    "epp_latency_prediction_error_ratio", "Relative error |predicted - actual| / actual of the predicted-latency-producer's prediction for the chosen endpoint, by type (ttft, tpot).",
    (*_MODEL, "type"), buckets=PREDICTION_ERROR_BUCKETS, registry=REGISTRY,
)  # fmt: skip

# --- ours: live config reload (docs/config-reload.md), named after Prometheus' own --------
CONFIG_RELOAD_TOTAL: Final = Counter(
    "inference_extension_config_reload", _h("Config file reloads by result: success (the new config serves), failure (rejected; the old one keeps serving) or unchanged (same config)."),
    ("result",), registry=REGISTRY,
)  # fmt: skip
CONFIG_GENERATION: Final = Gauge(
    "inference_extension_config_generation", _h("Generation of the config serving now (1 at startup, +1 per applied reload), labelled with its content hash."),
    ("hash",), registry=REGISTRY,
)  # fmt: skip
CONFIG_LAST_RELOAD_SUCCESSFUL: Final = Gauge(
    "inference_extension_config_last_reload_successful", _h("Whether the last config reload attempt succeeded (1) or was rejected (0)."),
    registry=REGISTRY,
)  # fmt: skip
CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP: Final = Gauge(
    "inference_extension_config_last_reload_success_timestamp_seconds", _h("Unix time the config serving now was loaded."),
    registry=REGISTRY,
)  # fmt: skip
