"""``epp explain``: replay one request through the server's own pipeline, offline.

The pipeline is assembled exactly as ``epp.app.compose.build_app`` assembles it (``config.load``,
``app.build``, ``components.admission.controller``, ``components.request_control.pipeline``
and a ``Director``), so the replay runs the real parser, data producers, admission and
scheduler; only the endpoints come from a snapshot instead of discovery and scraping, and
no socket is opened.  Plugin state that a running EPP learns from traffic (the prefix index,
in-flight load) starts empty here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load
from epp.datalayer.api import EndpointMetadata, Metrics
from epp.datastore.static import split_hostport
from epp.datastore.store import Datastore, PoolInfo
from epp.director.director import Director
from epp.errors import ConfigError, EppError
from epp.explain.record import DecisionRing, to_json


@dataclass(frozen=True, slots=True)
class SnapshotEndpoint:
    """One endpoint of a snapshot: where it is, its labels and its last metrics reading."""

    metadata: EndpointMetadata
    metrics: Metrics


def load_snapshot(text: str, *, source: str = "endpoints") -> list[SnapshotEndpoint]:
    """Endpoints from ``/debug/plugins/state`` JSON or the simple file (YAML or JSON), see docs/explain.md.

    Each item of ``endpoints``: ``address`` ("ip:port", or an IP with ``port``), optional
    ``name``, ``labels`` and ``metrics`` (``waitingQueueSize``, ``runningRequestsSize``,
    ``kvCacheUsagePercent`` in 0..1, ``activeModels``, ``waitingModels``).
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not JSON or YAML: {e}") from None
    items = data.get("endpoints") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{source}: expected a non-empty 'endpoints' list")
    out = []
    for i, item in enumerate(items):
        where = f"{source}: endpoints[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("address"), str):
            raise ConfigError(f"{where}: needs an 'address'")
        try:
            if "port" in item:
                host, port = item["address"].strip("[]"), int(item["port"])
            else:
                host, port = split_hostport(item["address"])
            m = item.get("metrics") or {}
            metrics = Metrics(
                waiting_queue_size=int(m.get("waitingQueueSize", 0)),
                running_requests_size=int(m.get("runningRequestsSize", 0)),
                kv_cache_usage_percent=float(m.get("kvCacheUsagePercent", 0.0)),
                active_models=frozenset(m.get("activeModels", ())),
                waiting_models=frozenset(m.get("waitingModels", ())),
                update_time=time.monotonic(),
            )
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
        name = str(item.get("name") or f"{host}:{port}")
        labels = {str(k): str(v) for k, v in (item.get("labels") or {}).items()}
        md = EndpointMetadata(
            name=name, address=host, port=port, pod_name=name, namespace="default", labels=labels
        )
        out.append(SnapshotEndpoint(md, metrics))
    return out


@dataclass(slots=True, kw_only=True)
class Replay:
    """What to replay: the config, the endpoints, and the request."""

    config_file: str = ""
    config_text: str = ""
    endpoints: Sequence[SnapshotEndpoint] = ()
    body: bytes = b""
    path: str = "/v1/chat/completions"
    headers: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # Envoy filter metadata (subset hint)
    timeout: float = 5.0  # admission may queue (flow control): give up after this long
    env: Mapping[str, str] = field(default_factory=dict)


async def replay(r: Replay) -> dict[str, Any]:
    """Route ``r``'s request once and return its decision as JSON (``record.to_json``)."""
    config = load(config_file=r.config_file, config_text=r.config_text)
    components = build(config, default_registry(), BuildOptions(env=r.env))
    ds = Datastore()
    ds.pool = PoolInfo(name="explain", namespace="default")
    ds.replace_all([e.metadata for e in r.endpoints])
    by_name = {e.metadata.name: e.metrics for e in r.endpoints}
    for ep in ds.endpoints():
        ep.metrics = by_name[ep.name]
    ds.pool_synced = True
    admission = components.admission.controller(ds)
    ring = DecisionRing(1)
    pipeline = components.request_control.pipeline(
        scheduler=components.scheduler, admission=admission, decisions=ring
    )
    director = Director(ds, pipeline)
    headers = {k.lower(): v for k, v in r.headers.items()}
    headers.setdefault(":method", "POST")
    headers.setdefault(":path", r.path)
    headers.setdefault("content-type", "application/json")
    headers.setdefault("x-request-id", "explain")
    async with contextlib.AsyncExitStack() as stack:
        if hasattr(admission, "__aenter__"):
            await stack.enter_async_context(admission)  # type: ignore[arg-type]
        lc = director.start(headers, r.metadata)
        error: EppError | None = None
        timed_out = False
        try:
            async with asyncio.timeout(r.timeout):
                await lc.route(r.body)
        except EppError as e:
            error = e
        except TimeoutError:
            timed_out = True
        lc.close(error)
    decision = ring.get(lc.request.request_id)
    assert decision is not None  # the lifecycle commits on every path
    if timed_out:  # flow control held the request: say so rather than "cancelled"
        decision.reason = "queued"
        decision.error = f"still waiting in admission after {r.timeout:g}s"
    return to_json(decision)
