"""Metrics of cross-replica sync (docs/scale-out.md).

Not GIE's and not llm-d's (neither has a sync transport to measure): ``epp_``-prefixed, in
the EPP's one registry.
"""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Gauge, Histogram
from epp.metrics.series import REGISTRY

# Fine between 2 and 20 ms, where the staleness goal (p99 <= 10 ms) is read: a p99 interpolated
# across a 10-ms-wide bucket overstated the traced p99 by 1.5-4 ms (bench/scaleout, part cost).
LAG_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.006,
    0.007,
    0.008,
    0.009,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)

PEERS: Final = Gauge(
    "epp_sync_peers",
    "Configured peers by state: connected (heard within --peer-timeout) or silent.",
    ("state",),
    registry=REGISTRY,
)
PARTITIONED: Final = Gauge(
    "epp_sync_partitioned",
    "1 while peers are configured and none is heard (routing on this replica's own view).",
    registry=REGISTRY,
)
BATCHES_SENT: Final = Counter(
    "epp_sync_batches_sent_total",
    "Delta batches published to peers (heartbeats not counted).",
    registry=REGISTRY,
)
BATCHES_RECEIVED: Final = Counter(
    "epp_sync_batches_received_total",
    "Delta batches received from peers and applied (not heartbeats).",
    registry=REGISTRY,
)
BATCH_BYTES_SENT: Final = Counter(
    "epp_sync_batch_bytes_sent_total",
    "Bytes of the delta batches published, each counted once however many peers it went to.",
    registry=REGISTRY,
)
BATCH_BYTES_RECEIVED: Final = Counter(
    "epp_sync_batch_bytes_received_total",
    "Bytes of the delta batches received from peers and applied.",
    registry=REGISTRY,
)
DROPPED: Final = Counter(
    "epp_sync_dropped_total",
    "Sync messages lost to a full queue (refused on send, or a gap in a sender's sequence).",
    registry=REGISTRY,
)
REJECTED: Final = Counter(
    "epp_sync_rejected_total",
    "Peer messages ignored, by reason (decode, type, frames, too_large, unknown_key, apply, "
    "unauthenticated: a call or snapshot request without one of --peer-secret-file's secrets).",
    ("reason",),
    registry=REGISTRY,
)
DELTA_LAG: Final = Histogram(
    "epp_sync_delta_lag_seconds",
    "From the first change a peer's delta batch carries (its routing decision) to this replica "
    "applying it (wall clocks; the sender's coalescing wait included).",
    buckets=LAG_BUCKETS,
    registry=REGISTRY,
)
