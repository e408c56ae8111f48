"""llm-d-router's llm_d_epp_* families: derived from GIE's at scrape time, switchable, and what the
shipped Grafana dashboard queries."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.api import EndpointMetadata, Metrics
from epp.datalayer.pool_metrics import PoolMetrics
from epp.datastore.store import Datastore, PoolInfo
from epp.health import metrics as health_metrics
from epp.metrics import series
from epp.metrics.exporter import MetricsServer
from epp.metrics.fast import Counter, Gauge, Histogram
from epp.metrics.llmd import NATIVE_COUNTERPARTS, TWINS, FamilySetView, parse_families
from epp.sync import metrics as sync_metrics
from epp.workers.balance import SLOTS_FILE, ConnectionBalance, Slots
from epp.workers.role import WorkerRole
from epp.workers.siblings import Siblings, WorkerSeries

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "grafana").glob("*.json"))
M = "llmd-test-model"


@pytest.fixture
def reg() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def test_request_family_twin_adds_fairness_and_priority(reg: CollectorRegistry) -> None:
    total = Counter(
        "inference_objective_request", "h", ("model_name", "target_model_name", "priority"), registry=reg
    )
    errors = Counter(
        "inference_objective_request_error",
        "h",
        ("model_name", "target_model_name", "error_code"),
        registry=reg,
    )
    total.labels("m", "t", "2").inc(3)
    errors.labels("m", "t", "BadRequest").inc()
    view = FamilySetView(reg)
    assert (
        view.get_sample_value(
            "inference_objective_request_total",
            {"model_name": "m", "target_model_name": "t", "priority": "2"},
        )
        == 3
    )
    labels = {"model_name": "m", "target_model_name": "t", "fairness_id": "", "priority": "2"}
    assert view.get_sample_value("llm_d_epp_request_total", labels) == 3
    err = {
        "model_name": "m",
        "target_model_name": "t",
        "fairness_id": "",
        "priority": "",
        "error_code": "BadRequest",
    }
    assert view.get_sample_value("llm_d_epp_request_error_total", err) == 1


def test_histogram_twin_keeps_buckets_sum_and_count(reg: CollectorRegistry) -> None:
    h = Histogram(
        "inference_objective_request_sizes",
        "h",
        ("model_name", "target_model_name"),
        buckets=(64, 128),
        registry=reg,
    )
    h.labels("m", "t").observe(100)
    view = FamilySetView(reg)
    base = {"model_name": "m", "target_model_name": "t", "fairness_id": "", "priority": ""}
    name = "llm_d_epp_request_size_bytes"
    assert view.get_sample_value(f"{name}_bucket", {**base, "le": "64.0"}) == 0
    assert view.get_sample_value(f"{name}_bucket", {**base, "le": "128.0"}) == 1
    assert view.get_sample_value(f"{name}_bucket", {**base, "le": "+Inf"}) == 1
    assert view.get_sample_value(f"{name}_sum", base) == 100
    assert view.get_sample_value(f"{name}_count", base) == 1
    text = generate_latest(view).decode()
    assert "# TYPE llm_d_epp_request_size_bytes histogram" in text


def test_renamed_labels_and_flow_control_requests(reg: CollectorRegistry) -> None:
    attempts = Counter(
        "inference_extension_scheduler_attempts",
        "h",
        ("status", "target_model_name", "pod_name", "namespace", "port"),
        registry=reg,
    )
    attempts.labels("success", "t", "p-rank-0", "ns", "8000").inc()
    Gauge("inference_extension_flow_control_pool_saturation", "h", ("inference_pool",), registry=reg).labels(
        "pool"
    ).set(0.7)
    fc = Histogram(
        "inference_extension_flow_control_request_queue_duration_seconds",
        "h",
        ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
        buckets=(1,),
        registry=reg,
    )
    fc.labels("a", "0", "Dispatched", "pool", "m", "t").observe(0.1)
    fc.labels("b", "0", "Dispatched", "pool", "m2", "t2").observe(0.1)
    fc.labels("b", "0", "RejectedCapacity", "pool", "m2", "t2").observe(0.1)
    view = FamilySetView(reg)
    assert (
        view.get_sample_value(
            "llm_d_epp_scheduler_attempts_total",
            {
                "status": "success",
                "target_model_name": "t",
                "endpoint_name": "p-rank-0",
                "namespace": "ns",
                "port": "8000",
            },
        )
        == 1
    )
    # the per-stage gauge is set by the flow controller (epp.metrics.disagg), not twinned
    assert view.get_sample_value("llm_d_epp_flow_control_pool_saturation", {"inference_pool": "pool"}) is None
    out = {"priority": "0", "inference_pool": "pool"}
    assert (
        view.get_sample_value("llm_d_epp_flow_control_requests_total", {"outcome": "Dispatched", **out}) == 2
    )
    assert (
        view.get_sample_value("llm_d_epp_flow_control_requests_total", {"outcome": "RejectedCapacity", **out})
        == 1
    )


def test_family_switch(reg: CollectorRegistry) -> None:
    Counter("inference_objective_request", "h", ("model_name", "target_model_name", "priority"), registry=reg)
    Gauge("unrelated_gauge", "h", registry=reg)

    def names(families: str) -> set[str]:
        return {f.name for f in FamilySetView(reg, parse_families(families)).collect()}

    assert names("gie,llm-d") == {"inference_objective_request", "llm_d_epp_request", "unrelated_gauge"}
    assert names("gie") == {"inference_objective_request", "unrelated_gauge"}
    assert names("llm-d") == {"llm_d_epp_request", "unrelated_gauge"}
    for bad in ("", "gie,", "prometheus"):
        with pytest.raises(ValueError, match="gie, llm-d"):
            parse_families(bad)


def test_every_gie_series_has_an_llm_d_twin() -> None:
    """Each GIE family of series.py (and the per-pod collector) is in the table."""
    gie = {
        f.name
        for f in series.REGISTRY.collect()
        if f.name.startswith(("inference_objective_", "inference_pool_", "inference_extension_"))
    }
    gie.add("inference_pool_per_pod_queue_size")
    gie -= NATIVE_COUNTERPARTS  # the per-stage saturation gauge is llm-d's own family
    assert gie <= set(TWINS), sorted(gie - set(TWINS))
    assert all(t.name.startswith("llm_d_epp_") for t in TWINS.values())


def test_twins_cost_nothing_per_request() -> None:
    """The request path records GIE's series only: the twins are not registered families.

    The only llm-d families registered are the ones GIE lacks (P/D decisions, per-stage
    saturation: epp.metrics.disagg), recorded once, never twinned."""
    importlib.import_module("epp.metrics.disagg")
    importlib.import_module("epp.metrics.encoder_cache")
    importlib.import_module("epp.metrics.rollout")
    registered = {f.name for f in series.REGISTRY.collect()}
    native = {n for n in registered if n.startswith("llm_d_")}
    assert native == {
        "llm_d_epp_disagg_decision",
        "llm_d_epp_pd_decision",
        "llm_d_inference_scheduler_disagg_decision",
        "llm_d_inference_scheduler_pd_decision",
        "llm_d_epp_flow_control_pool_saturation",
        "llm_d_epp_encoder_cache_queries",  # mm-embeddings-cache-producer's
        "llm_d_epp_encoder_cache_hits",
        "llm_d_epp_encoder_cache_hit_ratio",
        "llm_d_epp_disaggregatedset_strict_header_no_match",  # disaggregatedset-rollout-screener's
        "llm_d_epp_disaggregatedset_revision_gating_share",
    }
    assert not {t.name for t in TWINS.values()} & native


# --- the Grafana dashboard against a real /metrics ------------------------------------------------

_METRIC = re.compile(r"\b((?:llm_d_epp|inference|process|epp)_[a-zA-Z0-9_]+)\b(\{[^}]*\})?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)\s*"')
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}


def _exprs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


@pytest.fixture
def recorded() -> Iterator[None]:
    """One sample in the series whose labels the dashboard filters on (removed afterwards)."""
    importlib.import_module("epp.metrics.disagg")  # the per-stage saturation family: run alone, too
    series.SCHEDULER_ATTEMPTS_TOTAL.labels("success", M, "p-rank-0", "ns", "8000").inc()
    series.FC_POOL_SATURATION.labels(M).set(0.5)
    sync_metrics.PEERS.labels("connected").set(1)
    health_metrics.HEALTH_STATE.labels("p-rank-0").set(0)
    health_metrics.HEALTH_TRANSITIONS.labels("p-rank-0", "ejected", "errors").inc()
    yield
    series.SCHEDULER_ATTEMPTS_TOTAL.remove("success", M, "p-rank-0", "ns", "8000")
    series.FC_POOL_SATURATION.remove(M)
    sync_metrics.PEERS.remove("connected")
    health_metrics.HEALTH_STATE.remove("p-rank-0")
    health_metrics.HEALTH_TRANSITIONS.remove("p-rank-0", "ejected", "errors")


def _pod_series(run_dir: Path) -> str:
    """What worker 0 adds to a multi-worker pod's /metrics (epp.workers.siblings), and each
    worker's own series (its streams, the connections it serves and those it moved)."""
    role = WorkerRole(0, 2, run_dir, "pod")
    slots = Slots.create(run_dir / SLOTS_FILE, 2)
    balance = ConnectionBalance(role)
    reg = CollectorRegistry()
    reg.register(WorkerSeries(role, lambda: 0, balance))
    try:
        return Siblings(role).pod_series(2) + generate_latest(reg).decode()
    finally:
        balance.stop()
        slots.close()


async def _scrape() -> str:
    ds = Datastore()
    ds.pool = PoolInfo(name=M)
    ep = ds.upsert(EndpointMetadata(name="p-rank-0", address="10.0.0.1", port=8000))
    ep.metrics = Metrics(waiting_queue_size=1)
    async with (
        PoolMetrics(ds, interval=3600),
        MetricsServer("127.0.0.1", 0, enable_pprof=False) as srv,
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{srv.port}/metrics") as resp,
    ):
        assert resp.status == 200
        return await resp.text()


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
async def test_dashboard_queries_only_exported_series(path: Path, recorded: None, tmp_path: Path) -> None:
    exprs = list(_exprs(json.loads(path.read_bytes())))  # noqa: ASYNC240 - a small local file
    assert exprs
    # one EPP's /metrics (the sync's and endpoint health's families register on import, as in a
    # replica that runs them), and what worker 0 of a --workers pod adds
    families = list(text_string_to_metric_families(await _scrape() + _pod_series(tmp_path)))
    exported: dict[str, set[str]] = {}  # sample name -> label names seen
    for f in families:
        for name in (f.name, *(f.name + s for s in _SUFFIXES.get(f.type, ()))):
            exported.setdefault(name, set())
        for s in f.samples:
            exported.setdefault(s.name, set()).update(s.labels)
    missing, bad_labels = set(), set()
    for expr in exprs:
        for name, selector in _METRIC.findall(expr):
            if name not in exported:
                missing.add(name)
            elif selector and exported[name]:
                for label in _LABEL.findall(selector):
                    if label != "job" and label not in exported[name] | {"le"}:
                        bad_labels.add(f"{name}:{label}")
    assert not missing, sorted(missing)
    assert not bad_labels, sorted(bad_labels)
    assert any(n.startswith("llm_d_epp_") for e in exprs for n, _ in _METRIC.findall(e))


def test_native_llmd_families_follow_the_llmd_set(reg: CollectorRegistry) -> None:
    Counter("llm_d_epp_pd_decision", "h", ("decision_type",), registry=reg).labels("prefill-decode").inc()
    Gauge("llm_d_epp_flow_control_pool_saturation", "h", ("inference_pool", "stage"), registry=reg).labels(
        "pool", "prefill"
    ).set(0.5)
    both = FamilySetView(reg)
    assert both.get_sample_value("llm_d_epp_pd_decision_total", {"decision_type": "prefill-decode"}) == 1
    assert (
        both.get_sample_value(
            "llm_d_epp_flow_control_pool_saturation", {"inference_pool": "pool", "stage": "prefill"}
        )
        == 0.5
    )
    gie_only = FamilySetView(reg, ["gie"])
    assert (
        gie_only.get_sample_value("llm_d_epp_pd_decision_total", {"decision_type": "prefill-decode"}) is None
    )
