"""Merge the /metrics of N workers into one pod's series, as Prometheus' multiprocess mode does.

Per family kind (``docs/workers.md``):

* counters, histograms and summaries: **summed** per series (same name and label set) — every
  worker counts its own requests, the pod counts all of them; ``*_created`` takes the earliest;
* gauges: by family policy.  ``sum`` for what each worker holds a share of (``SUMMED_GAUGES``:
  requests running or queued in *this* process, the index it built, unless the workers sync
  routing state: then every index holds the pod's, a copy, ``SYNCED_COPIES``); ``max`` for everything
  else, because every worker watches the same pool and scrapes the same model servers, so their
  pool and endpoint gauges are copies of one value and summing them would multiply it by N;
* families that count what every worker observes of the same outside stream (``COPIED``: each
  engine's KV-event stream, each endpoint's health) take the ``max`` whatever their kind: N
  workers seeing one gap is one gap.  A series a worker labels with
  ``worker`` (its own identity) never collides with another worker's, so it passes through;
* a series only some workers have (label sets differ, e.g. a model only one worker has seen) is
  kept as it is: the union of all workers' series.

Only scrapes pay for this (parse N texts, one dict per series); nothing is done per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from prometheus_client import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

Policy = Literal["sum", "max", "min"]

# Gauges that are shares of the pod's total: each worker's own in-flight work or its own memory
# (GIE's names and their llm-d twins).
SUMMED_GAUGES: Final = frozenset(
    {
        "inference_objective_running_requests",
        "llm_d_epp_request_running",
        "inference_extension_flow_control_queue_size",
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_bytes",
        "llm_d_epp_flow_control_queue_bytes",
        "inference_extension_prefix_indexer_size",
        "llm_d_epp_prefix_indexer_size",
    }
)
# Shares that become copies when the workers sync routing state (epp.sync): every worker then
# inserts its siblings' prefix chains too, so each index holds the pod's, and a sum would count
# every entry once per worker.
SYNCED_COPIES: Final = frozenset({"inference_extension_prefix_indexer_size", "llm_d_epp_prefix_indexer_size"})
# Families (any kind) every worker observes the same way: copies, not shares.
COPIED: Final = ("epp_kv_events_", "epp_endpoint_health_")


def gauge_policy(name: str, *, synced: bool = False) -> Policy:
    """How one gauge family merges across workers (see the module docstring); ``synced``: the
    workers share routing state, so ``SYNCED_COPIES`` are copies."""
    if synced and name in SYNCED_COPIES:
        return "max"
    return "sum" if name in SUMMED_GAUGES else "max"


def _policy(kind: str, family: str, sample: str, synced: bool) -> Policy:
    if sample.endswith("_created"):
        return "min"
    if family.startswith(COPIED):
        return "max"
    if kind in ("counter", "histogram", "summary", "gaugehistogram"):
        return "sum"
    if kind == "gauge":
        return gauge_policy(family, synced=synced)
    return "max"  # info, stateset, unknown: identical copies in every worker


_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class _Family:
    metric: Metric
    values: dict[_Key, float]


def merge(texts: Iterable[str], *, synced: bool = False) -> list[Metric]:
    """The workers' expositions (text format 0.0.4) merged into one set of families, in first-seen
    order; ``synced``: the workers share routing state (``gauge_policy``)."""
    families: dict[str, _Family] = {}
    for text in texts:
        for m in text_string_to_metric_families(text):
            fam = families.get(m.name)
            if fam is None:
                fam = families[m.name] = _Family(Metric(m.name, m.documentation, m.type, m.unit), {})
            values = fam.values
            for s in m.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = values.get(key)
                if old is None:
                    values[key] = s.value
                    continue
                policy = _policy(fam.metric.type, m.name, s.name, synced)
                if policy == "sum":
                    values[key] = old + s.value
                elif policy == "max":
                    values[key] = max(old, s.value)
                else:
                    values[key] = min(old, s.value)
    out = []
    for fam in families.values():
        for (name, labels), value in fam.values.items():
            fam.metric.add_sample(name, dict(labels), value)
        out.append(fam.metric)
    return out


class _Merged:
    """A collector over already-merged families, so prometheus_client renders them."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def aggregate(texts: Iterable[bytes | str], *, synced: bool = False) -> bytes:
    """The pod's /metrics body from each worker's body (``synced``: see ``gauge_policy``)."""
    decoded = (t.decode() if isinstance(t, bytes) else t for t in texts)
    return generate_latest(_Merged(merge(decoded, synced=synced)))
