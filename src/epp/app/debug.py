"""``/debug/plugins/state``: what the running EPP is made of and how each part is doing, read live."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from epp.app.compose import App
from epp.datalayer.api import Endpoint
from epp.flowcontrol.api import SaturationDetector
from epp.flowcontrol.verdict import verdict
from epp.k8s.cluster import Cluster
from epp.plugin.base import DebugState


def debug_state(app: App, cluster: Cluster | None) -> dict[str, Any]:
    """``/debug/plugins/state``: every endpoint's metrics, staleness, health and scrape loop, the
    pool, the Kubernetes watches and lease, each plugin's own state (``DebugState``), every
    saturation detector's verdict on the pool and, with the ``flowControl`` gate, the queues.

    Everything is read from ``app`` at call time: a config reload replaces ``app.components``
    and ``app.admission`` (``app.swap``), so the plugins and queues shown are the live ones.
    """
    now = time.monotonic()
    endpoints = []
    pool_endpoints = app.datastore.endpoints()
    for ep in pool_endpoints:
        m, h, stats = ep.metrics, ep.health, app.data_layer.stats(ep)
        endpoints.append(
            {
                "name": ep.name,
                "namespace": ep.metadata.namespace,
                "podName": ep.metadata.pod_name,
                "address": ep.hostport,
                "labels": dict(ep.metadata.labels),
                "metrics": {
                    "waitingQueueSize": m.waiting_queue_size,
                    "runningRequestsSize": m.running_requests_size,
                    "kvCacheUsagePercent": m.kv_cache_usage_percent,
                    "activeModels": sorted(m.active_models),
                    "waitingModels": sorted(m.waiting_models),
                    "maxActiveModels": m.max_active_models,
                    "kvCacheMaxTokenCapacity": m.kv_cache_max_token_capacity,
                    "cacheBlockSize": m.cache_block_size,
                    "cacheNumBlocks": m.cache_num_blocks,
                },
                "metricsAgeSeconds": round(now - m.update_time, 3) if m.update_time else None,
                "health": {**h.debug_state(now), "unreachable": h.unreachable},  # docs/health.md
                "scrape": None
                if stats is None
                else {
                    "ticks": stats.ticks,
                    "failures": stats.failures,
                    "failing": stats.failing,
                    "lastError": stats.last_error,
                },
            }
        )
    pool = app.datastore.pool
    out: dict[str, Any] = {
        "pool": None
        if pool is None
        else {
            "name": pool.name,
            "namespace": pool.namespace,
            "targetPorts": list(pool.target_ports),
            "selector": dict(pool.selector),
            "appProtocol": pool.app_protocol,
            "synced": app.datastore.pool_synced,
        },
        "endpoints": endpoints,
        "objectives": {o.name: o.priority for o in app.datastore.objectives()},
        "modelRewrites": len(app.datastore.rewrites),
        "plugins": {
            name: plugin.debug_state()
            for name, plugin in app.components.plugins.items()
            if isinstance(plugin, DebugState)
        },
        "saturation": _saturation(app, pool_endpoints),
        # None on the legacy admission path (no queues); FlowControlAdmission is a DebugState
        "flowControl": app.admission.debug_state() if isinstance(app.admission, DebugState) else None,
        # active-active replicas (issue 30): peers, last heard, batches and reads; None without --peers
        "sync": app.sync_hub.debug_state() if app.sync_hub is not None else None,
    }
    if cluster is not None:
        out["kubernetes"] = {
            "leader": cluster.is_leader(),
            "watches": cluster.discovery.status() if cluster.discovery is not None else {},
            "missingKinds": list(cluster.discovery.missing_kinds) if cluster.discovery is not None else [],
        }
    return out


def _saturation(app: App, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """Each configured detector's verdict on the whole pool (``flowcontrol.verdict``), computed
    now; ``detector`` names the one admission uses.  Legacy admission asks its detector about
    each request's candidates, which may be a subset of the pool."""
    used = app.components.admission.detector
    return {
        "detector": used.typed_name.name,
        "detectors": {
            name: verdict(plugin, endpoints)
            for name, plugin in app.components.plugins.items()
            if isinstance(plugin, SaturationDetector)
        },
    }
