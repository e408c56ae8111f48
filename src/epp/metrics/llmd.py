"""llm-d-router's ``llm_d_epp_*`` metric families, derived from GIE's at scrape time.

llm-d-router (v0.10) writes every request metric twice: its ``llm_d_epp_*`` family and the legacy
GIE one.  Here the request path records GIE's series once (``epp.metrics.series``, lock-free) and
``FamilySetView`` renames them while ``/metrics`` is being rendered: no second increment per
request, and the cost of the twin is paid by the scraper thread.

``FamilySetView`` wraps the registry: one pass over its families yields each GIE family (unless the
``gie`` family set is off) followed by its llm-d twin (unless ``llm-d`` is off).  Families of
other collectors (process, platform, latency predictor, per-endpoint queue) go through the same
table, so a GIE family added elsewhere gets its twin by adding one row here.

Label differences are filled as llm-d-router names them (``docs/metrics.md`` there):
request families gain ``fairness_id`` and ``priority`` (empty where GIE's series do not carry
them: this EPP keeps one series per model pair, not per flow), ``request_ttft_seconds`` gains
``streaming``, ``scheduler_attempts_total`` says ``endpoint_name`` for ``pod_name``, the
per-endpoint queue gauge says ``model_server_endpoint`` and ``flow_control_requests_total`` is
summed from the queue-duration histogram's counts.  An empty label value is the same as no label
to Prometheus.  Families only llm-d-router has (``llm_d_*``: the P/D decision counters and
``llm_d_epp_flow_control_pool_saturation{stage}``, which the flow controller sets per stage) are
declared natively (``epp.metrics.disagg``) and served with the ``llm-d`` set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

GIE: Final = "gie"
LLMD: Final = "llm-d"
FAMILY_SETS: Final = (GIE, LLMD)
PREFIX: Final = "llm_d_epp_"
LLMD_NATIVE_PREFIX: Final = "llm_d_"

Labels = dict[str, str]
Relabel = Callable[[Mapping[str, str]], Iterable[Labels]]


class _Collects(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def parse_families(text: str) -> frozenset[str]:
    """``"gie,llm-d"`` → the family sets; raises ValueError for an empty or unknown entry."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p not in FAMILY_SETS for p in parts):
        raise ValueError(f"must be a comma-separated list of {', '.join(FAMILY_SETS)}")
    return frozenset(parts)


def _ordered(labels: Mapping[str, str], *front: tuple[str, str]) -> Labels:
    """``labels`` with the ``front`` names first (added with their default when missing)."""
    out = {name: labels.get(name, default) for name, default in front}
    out.update((k, v) for k, v in labels.items() if k not in out)
    return out


def _request(labels: Mapping[str, str]) -> Iterable[Labels]:
    # model_name, target_model_name, fairness_id, priority, then the family's own (error_code, le)
    yield _ordered(
        labels, ("model_name", ""), ("target_model_name", ""), ("fairness_id", ""), ("priority", "")
    )


def _ttft(labels: Mapping[str, str]) -> Iterable[Labels]:
    yield _ordered(
        labels,
        ("model_name", ""),
        ("target_model_name", ""),
        ("fairness_id", ""),
        ("priority", ""),
        ("streaming", ""),
    )


def _predictor(labels: Mapping[str, str]) -> Iterable[Labels]:
    yield _ordered(labels, ("plugin_name", ""), ("plugin_type", ""))


def _rename(old: str, new: str) -> Relabel:
    def relabel(labels: Mapping[str, str]) -> Iterable[Labels]:
        yield {(new if k == old else k): v for k, v in labels.items()}

    return relabel


def _same(labels: Mapping[str, str]) -> Iterable[Labels]:
    yield dict(labels)


@dataclass(frozen=True, slots=True)
class Twin:
    name: str  # the llm-d family name (a counter's without ``_total``, as prometheus_client keeps it)
    relabel: Relabel = _same


# GIE family name (as prometheus_client names it: counters without _total) -> its llm-d twin.
TWINS: Final[Mapping[str, Twin]] = {
    # request and latency
    "inference_objective_request": Twin("llm_d_epp_request", _request),
    "inference_objective_request_error": Twin("llm_d_epp_request_error", _request),
    "inference_objective_request_duration_seconds": Twin("llm_d_epp_request_duration_seconds", _request),
    "inference_objective_request_sizes": Twin("llm_d_epp_request_size_bytes", _request),
    "inference_objective_response_sizes": Twin("llm_d_epp_response_size_bytes", _request),
    "inference_objective_input_tokens": Twin("llm_d_epp_request_input_tokens", _request),
    "inference_objective_output_tokens": Twin("llm_d_epp_request_output_tokens", _request),
    "inference_objective_prompt_cached_tokens": Twin("llm_d_epp_request_cached_tokens", _request),
    "inference_objective_running_requests": Twin("llm_d_epp_request_running", _request),
    "inference_objective_normalized_time_per_output_token_seconds": Twin(
        "llm_d_epp_request_ntpot_seconds", _request
    ),
    "inference_objective_request_ttft_seconds": Twin("llm_d_epp_request_ttft_seconds", _ttft),
    "inference_objective_request_tpot_seconds": Twin("llm_d_epp_request_streaming_tpot_seconds", _request),
    # predicted latency and SLO
    "inference_objective_request_predicted_ttft_seconds": Twin(
        "llm_d_epp_request_predicted_ttft_seconds", _predictor
    ),
    "inference_objective_request_predicted_tpot_seconds": Twin(
        "llm_d_epp_request_predicted_tpot_seconds", _predictor
    ),
    "inference_objective_request_ttft_prediction_duration_seconds": Twin(
        "llm_d_epp_request_ttft_prediction_duration_seconds", _predictor
    ),
    "inference_objective_request_tpot_prediction_duration_seconds": Twin(
        "llm_d_epp_request_tpot_prediction_duration_seconds", _predictor
    ),
    "inference_objective_request_slo_violation": Twin("llm_d_epp_request_slo_violation", _predictor),
    "inference_objective_inference_request_metric": Twin("llm_d_epp_inference_request_metric", _predictor),
    # inference pool
    "inference_pool_average_kv_cache_utilization": Twin("llm_d_epp_average_kv_cache_utilization"),
    "inference_pool_average_queue_size": Twin("llm_d_epp_average_queue_size"),
    "inference_pool_average_running_requests": Twin("llm_d_epp_average_running_requests"),
    "inference_pool_ready_pods": Twin("llm_d_epp_ready_endpoints"),
    "inference_pool_per_pod_queue_size": Twin(
        "llm_d_epp_per_endpoint_queue_size", _rename("model_server_pod", "model_server_endpoint")
    ),
    # scheduler, plugins, info, model rewrite
    "inference_extension_scheduler_e2e_duration_seconds": Twin("llm_d_epp_scheduler_e2e_duration_seconds"),
    "inference_extension_scheduler_attempts": Twin(
        "llm_d_epp_scheduler_attempts", _rename("pod_name", "endpoint_name")
    ),
    "inference_extension_plugin_duration_seconds": Twin("llm_d_epp_plugin_duration_seconds"),
    "inference_extension_info": Twin("llm_d_epp_info"),
    "inference_extension_model_rewrite_decisions": Twin("llm_d_epp_model_rewrite_decisions"),
    # live config reload (ours; llm-d-router has none: named as its other families are)
    "inference_extension_config_reload": Twin("llm_d_epp_config_reload"),
    "inference_extension_config_generation": Twin("llm_d_epp_config_generation"),
    "inference_extension_config_last_reload_successful": Twin("llm_d_epp_config_last_reload_successful"),
    "inference_extension_config_last_reload_success_timestamp_seconds": Twin(
        "llm_d_epp_config_last_reload_success_timestamp_seconds"
    ),
    # prefix indexer (llm-d labels them by plugin; this EPP has one indexer)
    "inference_extension_prefix_indexer_size": Twin("llm_d_epp_prefix_indexer_size", _predictor),
    "inference_extension_prefix_indexer_hit_ratio": Twin("llm_d_epp_prefix_indexer_hit_ratio", _predictor),
    "inference_extension_prefix_indexer_hit_bytes": Twin("llm_d_epp_prefix_indexer_hit_bytes", _predictor),
    # flow control
    "inference_extension_flow_control_request_queue_duration_seconds": Twin(
        "llm_d_epp_flow_control_request_queue_duration_seconds"
    ),
    "inference_extension_flow_control_dispatch_cycle_duration_seconds": Twin(
        "llm_d_epp_flow_control_dispatch_cycle_duration_seconds"
    ),
    "inference_extension_flow_control_request_enqueue_duration_seconds": Twin(
        "llm_d_epp_flow_control_request_enqueue_duration_seconds"
    ),
    "inference_extension_flow_control_queue_size": Twin("llm_d_epp_flow_control_queue_size"),
    "inference_extension_flow_control_queue_bytes": Twin("llm_d_epp_flow_control_queue_bytes"),
}

# GIE families whose llm-d counterpart is declared natively (epp.metrics.disagg), not twinned.
NATIVE_COUNTERPARTS: Final = frozenset({"inference_extension_flow_control_pool_saturation"})

GIE_PREFIXES: Final = ("inference_objective_", "inference_pool_", "inference_extension_")
FC_QUEUE_DURATION: Final = "inference_extension_flow_control_request_queue_duration_seconds"
FC_REQUESTS: Final = "llm_d_epp_flow_control_requests"
_FC_REQUESTS_LABELS: Final = ("outcome", "priority", "inference_pool")


def is_gie(name: str) -> bool:
    return name.startswith(GIE_PREFIXES)


def twin(family: Metric, spec: Twin) -> Metric:
    """``family`` under ``spec.name``, each sample relabelled (a sample may become several)."""
    out = Metric(spec.name, family.documentation, family.type, family.unit)
    cut = len(family.name)
    for s in family.samples:
        suffix = s.name[cut:]  # _total, _bucket, _sum, _count or ""
        for labels in spec.relabel(s.labels):
            out.samples.append(Sample(spec.name + suffix, labels, s.value, s.timestamp, s.exemplar))
    return out


def flow_control_requests(queue_duration: Metric) -> Metric:
    """``llm_d_epp_flow_control_requests_total{outcome, priority, inference_pool}`` from the counts."""
    out = Metric(
        FC_REQUESTS,
        "[ALPHA] Total requests processed by the Flow Control layer, by terminal outcome.",
        "counter",
    )
    totals: dict[tuple[str, ...], float] = {}
    for s in queue_duration.samples:
        if s.name.endswith("_count"):
            key = tuple(s.labels.get(n, "") for n in _FC_REQUESTS_LABELS)
            totals[key] = totals.get(key, 0.0) + s.value
    for key, value in totals.items():
        out.samples.append(
            Sample(FC_REQUESTS + "_total", dict(zip(_FC_REQUESTS_LABELS, key, strict=True)), value)
        )
    return out


class FamilySetView:
    """What ``/metrics`` serves: ``registry``'s families, GIE's and/or their llm-d twins.

    Has the ``collect`` that ``generate_latest`` needs, so it stands in for the registry.
    """

    def __init__(self, registry: _Collects, families: Iterable[str] = FAMILY_SETS) -> None:
        self._registry = registry
        self.families = frozenset(families)
        self._gie = GIE in self.families
        self._llmd = LLMD in self.families

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.name.startswith(LLMD_NATIVE_PREFIX):  # declared with llm-d's name: no twin
                if self._llmd:
                    yield family
                continue
            gie = is_gie(family.name)
            if not gie or self._gie:
                yield family
            if self._llmd and gie:
                spec = TWINS.get(family.name)
                if spec is not None:
                    yield twin(family, spec)
                if family.name == FC_QUEUE_DURATION:
                    yield flow_control_requests(family)

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """As ``CollectorRegistry.get_sample_value``, over what is exposed (tests)."""
        wanted = dict(labels or {})
        for family in self.collect():
            for s in family.samples:
                if s.name == name and s.labels == wanted:
                    return float(s.value)
        return None
