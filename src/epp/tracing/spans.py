"""Span and tracer names and attribute keys: GIE's and llm-d-router's verbatim where they have one,
so traces line up across the EPPs; the per-stage spans are ours (marked below)."""

from __future__ import annotations

from typing import Final

# The whole ext_proc stream of one HTTP request (server kind); parent comes from `traceparent`.
REQUEST_TRACER: Final = "gateway-api-inference-extension/epp/extproc"
REQUEST_SPAN: Final = "gateway.request"

# The director's HandleRequest: rewrite, objective, admission, scheduling (server kind, child of the above).
ORCHESTRATION_TRACER: Final = "gateway-api-inference-extension"
ORCHESTRATION_SPAN: Final = "gateway.request_orchestration"
ATTR_TARGET_MODEL: Final = "target_model"
ATTR_REQUEST_PRIO: Final = "request_prio"

# One internal span per routing stage, children of the orchestration span (ours; the scheduler
# profile span and its profile-name attribute carry llm-d-router's names).
STAGE_TRACER: Final = "epp/director"
STAGE_PARSE: Final = "epp.parse"
STAGE_ADMISSION: Final = "epp.admission"
STAGE_PRODUCERS: Final = "epp.producers"
STAGE_ADMIT_PLUGINS: Final = "epp.admit_plugins"
STAGE_SCHEDULE: Final = "epp.schedule"
STAGE_PROFILE: Final = "run_scheduler_profile"
STAGE_PICK: Final = "epp.pick"
ATTR_MODEL: Final = "epp.request.model"
ATTR_TARGET: Final = "epp.request.target_model"
ATTR_OBJECTIVE: Final = "epp.request.objective"
ATTR_PRIORITY: Final = "epp.request.priority"
ATTR_BODY_BYTES: Final = "epp.request.body_bytes"
ATTR_MODEL_REWRITE: Final = "epp.request.model_rewrite"
ATTR_CANDIDATES: Final = "epp.candidates"
ATTR_PRODUCERS: Final = "epp.producers"
ATTR_PLUGINS: Final = "epp.plugins"
ATTR_OUTCOME: Final = "epp.outcome"
ATTR_PROFILE_NAME: Final = "llm_d.epp.scheduling.profile.name"
ATTR_TARGETS: Final = "epp.targets"
ATTR_PRIMARY_PROFILE: Final = "epp.primary_profile"
ATTR_PROFILE_RESULTS: Final = "epp.profile_results"
ATTR_DESTINATION: Final = "epp.destination"

# W3C headers read from the client request and written to the upstream request.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
BAGGAGE: Final = "baggage"

# Environment (OpenTelemetry's standard variables) and GIE's defaults for them.
ENV_SDK_DISABLED: Final = "OTEL_SDK_DISABLED"
ENV_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
ENV_EXPORTER: Final = "OTEL_TRACES_EXPORTER"
ENV_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTLP_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_SAMPLER: Final = "OTEL_TRACES_SAMPLER"
ENV_SAMPLER_ARG: Final = "OTEL_TRACES_SAMPLER_ARG"
DEFAULT_SERVICE_NAME: Final = "gateway-api-inference-extension/epp"
DEFAULT_OTLP_ENDPOINT: Final = "http://localhost:4317"
SUPPORTED_SAMPLER: Final = "parentbased_traceidratio"
DEFAULT_SAMPLE_RATIO: Final = 0.1

# P/D disaggregation (llm-d-router's disagg profile handler), on the pick span of sampled requests.
ATTR_PD_USED: Final = "llm_d.epp.pd.disaggregation_used"
ATTR_PD_PREFILL_ADDRESS: Final = "llm_d.epp.pd.prefill_pod_address"
ATTR_PD_PREFILL_PORT: Final = "llm_d.epp.pd.prefill_pod_port"
ATTR_PD_REASON: Final = "llm_d.epp.pd.reason"
ATTR_PROFILE_HANDLER_DECISION: Final = "llm_d.epp.profile_handler.decision"
ATTR_PD_DECLINED_PROFILE: Final = (
    "epp.pd.declined_profile"  # ours: the profile that served a declined request
)
