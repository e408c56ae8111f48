"""Metrics of the KV-event subscriber and the precise prefix scorer (docs/precise-prefix.md).

Not GIE's (it has none of these): ``epp_``-prefixed, in the EPP's one registry.
"""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Gauge, Histogram
from epp.metrics.series import REGISTRY, TOKEN_BUCKETS

KV_EVENT_BATCHES: Final = Counter(
    "epp_kv_events_batches_total", "KV event batches applied to the index, per endpoint.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_GAPS: Final = Counter(
    "epp_kv_events_gaps_total", "Sequence gaps seen in an endpoint's KV event stream.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_RESTARTS: Final = Counter(
    "epp_kv_events_restarts_total", "Engine restarts seen as a sequence number going back.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_REPLAYS: Final = Counter(
    "epp_kv_events_replays_total", "Replay requests to an engine's replay socket, by outcome (ok, incomplete, timeout).",
    ("endpoint", "outcome"), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_MISMATCHES: Final = Counter(
    "epp_kv_events_mismatch_total", "Events that contradict the configuration (kind: block_size, hash_scheme).",
    ("endpoint", "kind"), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_DECODE_ERRORS: Final = Counter(
    "epp_kv_events_decode_errors_total", "KV event messages that could not be decoded.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_CONSISTENT: Final = Gauge(
    "epp_kv_events_endpoint_consistent", "1 while the endpoint's KV event stream is trusted, 0 while scoring falls back to the approximate index.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_HASH_CHECKS: Final = Counter(
    "epp_kv_events_hash_checks_total", "Sampled root blocks re-hashed with the configured algorithm and seed, by outcome (passed, failed).",
    ("endpoint", "outcome"), registry=REGISTRY,
)  # fmt: skip
KV_EVENT_VERIFY_ROUNDS: Final = Counter(
    "epp_kv_events_verify_rounds_total", "Hash verification rounds begun (a new stream, an engine restart, an unreplayed gap, periodic).",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
TRANSITION_CAUSES: Final = (
    "in_sequence", "restart", "cleared", "replayed", "gap", "rebuilding", "undecodable", "silence",
    "block_size_mismatch", "hash_scheme_mismatch",
)  # fmt: skip
KV_EVENT_TRANSITIONS: Final = Counter(
    "epp_kv_events_consistency_transitions_total", "Consistency changes of an endpoint's KV event stream, by the state entered and its cause.",
    ("endpoint", "consistent", "cause"), registry=REGISTRY,
)  # fmt: skip
KV_INDEX_BLOCKS: Final = Gauge(
    "epp_kv_events_index_blocks", "Distinct KV block hashes held by any endpoint in the precise index.",
    registry=REGISTRY,
)  # fmt: skip
PRECISE_PREDICTED_TOKENS: Final = Histogram(
    "epp_precise_prefix_predicted_tokens", "Prompt tokens the precise index expected the picked endpoint to have cached.",
    buckets=TOKEN_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PRECISE_OBSERVED_TOKENS: Final = Histogram(
    "epp_precise_prefix_observed_tokens", "Prompt tokens the engine reported as cached (usage.prompt_tokens_details.cached_tokens).",
    buckets=TOKEN_BUCKETS, registry=REGISTRY,
)  # fmt: skip
PRECISE_PREDICTION_ERROR_TOKENS: Final = Histogram(
    "epp_precise_prefix_prediction_error_tokens", "|predicted - observed| cached prompt tokens per request.",
    buckets=(0, *TOKEN_BUCKETS), registry=REGISTRY,
)  # fmt: skip
PRECISE_FALLBACKS: Final = Counter(
    "epp_precise_prefix_fallback_total", "Endpoint scorings served by the approximate index because the endpoint's events were inconsistent.",
    ("endpoint",), registry=REGISTRY,
)  # fmt: skip
