"""Span and tracer names and attribute keys, verbatim from GIE so traces line up across both EPPs."""

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
