"""llm-d-router's P/D disaggregation families, declared natively (GIE has no such metric).

``llm_d_epp_disagg_decision_total`` counts every decision of a disaggregating profile handler,
``llm_d_epp_pd_decision_total`` only those of a handler with a prefill decider (P/D), both
labelled ``plugin_name, plugin_type, model_name, decision_type`` (an empty model is
``unknown``), each with its deprecated ``llm_d_inference_scheduler_*`` twin labelled
``model_name, decision_type`` (llm-d-router issue #1070).  Being llm-d names, they follow the
``llm-d`` family set of ``--metrics-families`` (``epp.metrics.llmd.FamilySetView``).

``llm_d_epp_flow_control_pool_saturation{inference_pool, stage}`` is flow control's
saturation per stage (``prefill``, ``decode``, ``effective``), set by the flow controller.

Decision types are llm-d's four plus ``prefill-unavailable``: the decider asked for a
prefill leg and the prefill profile found no endpoint, so the request failed (this EPP fails
closed; llm-d-router before PR #2521 ran such requests decode-only).

``epp_pd_declined_total{plugin_name, model_name, profile}`` is ours: it counts only handlers with
a ``declinedProfile`` and says which profile's pick served each declined request (the declined
profile, or the decode profile when the declined one found no endpoint).
"""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Gauge
from epp.metrics.series import REGISTRY

DECODE_ONLY: Final = "decode-only"
PREFILL_DECODE: Final = "prefill-decode"
ENCODE_DECODE: Final = "encode-decode"
ENCODE_PREFILL_DECODE: Final = "encode-prefill-decode"
PREFILL_UNAVAILABLE: Final = "prefill-unavailable"

_LABELS = ("plugin_name", "plugin_type", "model_name", "decision_type")

DISAGG_DECISION_TOTAL: Final = Counter(
    "llm_d_epp_disagg_decision", "[ALPHA] Total number of disaggregation routing decisions made",
    _LABELS, registry=REGISTRY,
)  # fmt: skip
PD_DECISION_TOTAL: Final = Counter(
    "llm_d_epp_pd_decision", "[ALPHA] Total number of P/D disaggregation decisions made",
    _LABELS, registry=REGISTRY,
)  # fmt: skip
SCHEDULER_DISAGG_DECISION_TOTAL: Final = Counter(
    "llm_d_inference_scheduler_disagg_decision",
    "[ALPHA] [Deprecated: Use llm_d_epp_disagg_decision_total] "
    "Total number of disaggregation routing decisions made",
    ("model_name", "decision_type"), registry=REGISTRY,
)  # fmt: skip
SCHEDULER_PD_DECISION_TOTAL: Final = Counter(
    "llm_d_inference_scheduler_pd_decision",
    "[ALPHA] [Deprecated: Use llm_d_epp_pd_decision_total] Total number of P/D disaggregation decisions made",
    ("model_name", "decision_type"), registry=REGISTRY,
)  # fmt: skip
# ours (llm-d-router has no declinedProfile): which profile served the requests the decider declined
DECLINED_TOTAL: Final = Counter(
    "epp_pd_declined",
    "Requests the prefill decider declined, by the scheduling profile whose pick served them whole "
    "(the decode profile, or the handler's declinedProfile).",
    ("plugin_name", "model_name", "profile"), registry=REGISTRY,
)  # fmt: skip
FC_POOL_STAGE_SATURATION: Final = Gauge(
    "llm_d_epp_flow_control_pool_saturation",
    "[ALPHA] Current saturation level of the inference pool as seen by flow control, per stage.",
    ("inference_pool", "stage"), registry=REGISTRY,
)  # fmt: skip


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """llm-d's ``DisaggDecisionType``."""
    if encode_used and prefill_used:
        return ENCODE_PREFILL_DECODE
    if encode_used:
        return ENCODE_DECODE
    if prefill_used:
        return PREFILL_DECODE
    return DECODE_ONLY


def record_decision(plugin_name: str, plugin_type: str, model: str, decision: str, *, pd: bool) -> None:
    """Count one decision in the disagg families, and in the P/D ones when ``pd``."""
    model = model or "unknown"
    DISAGG_DECISION_TOTAL.labels(plugin_name, plugin_type, model, decision).inc()
    SCHEDULER_DISAGG_DECISION_TOTAL.labels(model, decision).inc()
    if pd:
        PD_DECISION_TOTAL.labels(plugin_name, plugin_type, model, decision).inc()
        SCHEDULER_PD_DECISION_TOTAL.labels(model, decision).inc()


def record_declined(plugin_name: str, model: str, profile: str) -> None:
    """Count one declined request served whole by ``profile``'s pick (handlers with ``declinedProfile``)."""
    DECLINED_TOTAL.labels(plugin_name, model or "unknown", profile).inc()
