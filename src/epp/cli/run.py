"""Compose the EPP from Options: build everything (all or nothing), then start, serve, drain, stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from epp import __version__
from epp.admission.api import AdmissionController
from epp.cli.flags import Options
from epp.config.build import BuildOptions, Components, build, parser_supports
from epp.config.load import load
from epp.config.registry import default_registry
from epp.config.reload import ConfigReloader
from epp.datalayer.api import Endpoint
from epp.datalayer.pool_metrics import PoolMetrics
from epp.datalayer.runtime import DataLayerRuntime
from epp.datastore.objects import apply_objects, load_objects
from epp.datastore.static import endpoints_from_pairs, load_endpoints_file
from epp.datastore.store import Datastore, PoolInfo
from epp.datastore.watch import WatchedFile
from epp.director.director import Director
from epp.explain.record import DecisionRing
from epp.flowcontrol.api import SaturationDetector
from epp.flowcontrol.verdict import verdict
from epp.k8s.cluster import Cluster
from epp.k8s.discovery import DiscoverySpec
from epp.k8s.leader import Timings
from epp.metrics import series
from epp.metrics.exporter import MetricsServer
from epp.metrics.llmd import parse_families
from epp.plugin.base import DebugState
from epp.server import extproc, health
from epp.server.h2.limits import H2Limits
from epp.server.transport import Tls, make_server
from epp.tracing.otel import Tracing, setup_tracing

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class App:
    """Everything built from the command line; nothing here has started."""

    options: Options
    components: Components
    datastore: Datastore
    director: Director
    data_layer: DataLayerRuntime
    admission: AdmissionController
    tracing: Tracing
    env: Mapping[str, str] = field(default_factory=dict)
    kubernetes: DiscoverySpec | None = None  # pool or standalone mode: what to watch
    watched: list[WatchedFile[Any]] = field(default_factory=list)
    serving: bool = False  # the ext_proc port is listening (TLS set up)
    draining: bool = False


def _standalone_protocol(components: Components) -> str:
    """Without an InferencePool to say so, the pool speaks what the configured parser serves."""
    protocols = components.parser.APP_PROTOCOLS
    return "http" if not protocols or "http" in protocols else sorted(protocols)[0]


def _kubernetes_spec(options: Options, app_protocol: str) -> DiscoverySpec | None:
    """What to watch in pool (``--pool-name``) or standalone (``--endpoint-selector``) mode."""
    if not (options.pool_name or options.endpoint_selector):
        return None
    return DiscoverySpec(
        namespace=options.pool_namespace or "default",
        pool_name=options.pool_name,
        pool_group=options.pool_group,
        selector=dict(options.endpoint_selector_labels),
        target_ports=options.endpoint_target_ports,
        standalone_name=options.deployment_name,
        app_protocol=app_protocol,
        metrics_port=options.model_server_metrics_port,
    )


def _discovery(options: Options, ds: Datastore, app_protocol: str) -> list[WatchedFile[Any]]:
    """Fill the datastore from --endpoints / --endpoints-file / --objectives-file (Kubernetes
    modes fill it from watches once serving; standalone mode may still take an objectives file)."""
    namespace = options.pool_namespace or "default"
    kubernetes = bool(options.pool_name or options.endpoint_selector)
    if not kubernetes:
        ds.pool = PoolInfo(name=options.pool_label, namespace=namespace, app_protocol=app_protocol)
    watched: list[WatchedFile[Any]] = []
    if options.endpoints:
        ds.replace_all(endpoints_from_pairs([(hp.host, hp.port) for hp in options.endpoints], namespace))
    elif options.endpoints_file:
        wf = WatchedFile(
            options.endpoints_file,
            lambda text: load_endpoints_file(text, namespace, source=options.endpoints_file),
            ds.replace_all,
            what="endpoints file",
        )
        wf.load_now()
        watched.append(wf)
    if options.objectives_file:
        of = WatchedFile(
            options.objectives_file,
            lambda text: load_objects(text, source=options.objectives_file),
            lambda objs: apply_objects(ds, objs),
            what="objectives file",
        )
        of.load_now()
        watched.append(of)
    ds.pool_synced = not kubernetes
    return watched


def build_app(options: Options, env: Mapping[str, str]) -> App:
    """Validate and build every component; raises ConfigError and starts nothing.

    The config layer hands each concept its section (``config.build``); here the objects the
    concepts returned are composed with what the command line adds: the datastore and how it
    is filled, the polling interval, the request pipeline's tuning.
    """
    config = load(config_file=options.config_file, config_text=options.config_text)
    components = build(
        config, default_registry(), BuildOptions(metrics=options.model_server_metrics, env=env)
    )
    ds = Datastore()
    protocol = _standalone_protocol(components)
    watched = _discovery(options, ds, protocol)
    data_layer = components.data_layer.runtime(ds, refresh_interval=options.refresh_metrics_interval)
    admission = components.admission.controller(ds)
    pipeline = components.request_control.pipeline(
        scheduler=components.scheduler,
        admission=admission,
        subset_filter=not options.disable_endpoint_subset_filter,
        emit_endpoint_scores=options.emit_endpoint_scores,
        explain_header=options.explain_request_header,
        decisions=DecisionRing(options.decisions_buffer_size) if options.decisions_buffer_size > 0 else None,
        staleness_threshold=options.metrics_staleness_threshold,
    )
    return App(
        options=options,
        components=components,
        datastore=ds,
        director=Director(ds, pipeline),
        data_layer=data_layer,
        admission=admission,
        tracing=setup_tracing(options, env),
        env=dict(env),
        kubernetes=_kubernetes_spec(options, protocol),
        watched=watched,
    )


def debug_state(app: App, cluster: Cluster | None) -> dict[str, Any]:
    """``/debug/plugins/state``: every endpoint's metrics, staleness, health and scrape loop, the
    pool, the Kubernetes watches and lease, each plugin's own state (``DebugState``), every
    saturation detector's verdict on the pool and, with the ``flowControl`` gate, the queues.

    Everything is read from ``app`` at call time: a config reload replaces ``app.components``
    and ``app.admission`` (``config.swap``), so the plugins and queues shown are the live ones.
    """
    now = time.monotonic()
    endpoints = []
    pool_endpoints = app.datastore.endpoints()
    for ep in pool_endpoints:
        m, h, stats = ep.metrics, ep.health, app.data_layer.stats(ep)
        endpoints.append(
            {
                "name": ep.name,
                "address": ep.hostport,
                "labels": dict(ep.metadata.labels),
                "metrics": {
                    "waitingQueueSize": m.waiting_queue_size,
                    "runningRequestsSize": m.running_requests_size,
                    "kvCacheUsagePercent": m.kv_cache_usage_percent,
                    "activeModels": sorted(m.active_models),
                    "waitingModels": sorted(m.waiting_models),
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


def _cluster(app: App) -> Cluster | None:
    opts = app.options
    if app.kubernetes is None:
        return None
    timings = Timings(
        lease_duration=opts.leader_election_lease_duration,
        renew_deadline=opts.leader_election_renew_deadline,
        retry_period=opts.leader_election_retry_period,
    )
    return Cluster(
        app.kubernetes,
        kubeconfig=opts.kubeconfig,
        env=app.env,
        leader_election=timings if opts.ha_enable_leader_election else None,
        metrics_auth=opts.metrics_endpoint_auth,
        notification_sources=app.data_layer.k8s_sources,  # type: ignore[arg-type]
    )


def _address(options: Options, port: int) -> str:
    host = options.bind_address or "[::]"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


async def serve(app: App, *, stop: asyncio.Event | None = None) -> int:
    """Start in dependency order, serve until SIGTERM/SIGINT (or ``stop``), drain, stop in reverse."""
    opts = app.options
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    series.INFO.labels(commit="", build_ref=__version__).set(1)

    def ready() -> bool:
        ds = app.datastore
        protocol = ds.pool.app_protocol if ds.pool else "http"
        return (
            app.serving
            and ds.pool_synced
            and not app.draining
            and parser_supports(app.components.parser, protocol)
        )

    cluster = _cluster(app)
    if cluster is not None:
        await cluster.connect()  # a bad kubeconfig fails here, before anything starts
    health_servicer = health.HealthServicer(
        ready,
        leader_election=opts.ha_enable_leader_election,
        leader=cluster.is_leader if cluster is not None else lambda: True,
    )
    async with contextlib.AsyncExitStack() as stack:
        for plugin in app.components.lifecycle:
            await plugin.start()
            stack.push_async_callback(plugin.stop)
        for observer in app.components.observers:
            app.datastore.add_observer(observer)
        await stack.enter_async_context(app.data_layer)
        if hasattr(app.admission, "__aenter__"):
            await stack.enter_async_context(app.admission)  # type: ignore[arg-type]
        for wf in app.watched:
            await wf.start()
            stack.push_async_callback(wf.stop)
        await stack.enter_async_context(ConfigReloader(app))  # --config-file changes apply live
        if cluster is not None:
            stack.push_async_callback(cluster.stop)
            await cluster.start(app.datastore)
        await stack.enter_async_context(
            PoolMetrics(
                app.datastore,
                interval=opts.refresh_prometheus_metrics_interval,
                staleness_threshold=opts.metrics_staleness_threshold,
                scrape_interval=opts.refresh_metrics_interval,
            )
        )
        authorize = cluster.authorize if cluster is not None and cluster.authorizer is not None else None
        metrics_server = await stack.enter_async_context(
            MetricsServer(
                opts.bind_address,
                opts.metrics_port,
                enable_pprof=opts.enable_pprof,
                authorize=authorize,
                families=parse_families(opts.metrics_families),
                debug_state=lambda: debug_state(app, cluster),
                decisions=app.director.pipeline.decisions,
            )
        )
        if opts.metrics_endpoint_auth and authorize is None:
            log.warning(
                "metrics_auth_unavailable",
                reason="--metrics-endpoint-auth needs Kubernetes' TokenReview API (no-Kubernetes mode)",
                served="without authentication",
            )

        health_server = grpc.aio.server()
        health.add_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(_address(opts, opts.grpc_health_port))
        await health_server.start()
        stack.push_async_callback(health_server.stop, 0)

        servicer = extproc.ExtProcServicer(
            app.director, max_body_bytes=opts.max_request_body_bytes, tracing=app.tracing
        )
        limits = H2Limits(
            max_concurrent_streams=opts.grpc_max_concurrent_streams,
            max_message_bytes=opts.grpc_max_message_bytes,
            keepalive_time=opts.grpc_keepalive_time,
            keepalive_timeout=opts.grpc_keepalive_timeout,
            idle_timeout=opts.grpc_max_connection_idle,
        )
        server = make_server(
            opts.ext_proc_transport, servicer, health_servicer if opts.health_checking else None, limits
        )
        tls = Tls(opts.cert_path, opts.enable_cert_reload) if opts.secure_serving else None
        grpc_port = await server.start(opts.bind_address, opts.grpc_port, tls)
        app.serving = True  # only now may probes say SERVING: a self-signed key takes seconds
        tune_gc()
        log.info(
            "epp_started",
            version=__version__,
            transport=opts.ext_proc_transport,
            grpc_port=grpc_port,
            grpc_health_port=health_port,
            metrics_port=metrics_server.port,
            endpoints=len(app.datastore.endpoints()),
            plugins=list(app.components.plugins),
            feature_gates=sorted(app.components.feature_gates),
            secure_serving=opts.secure_serving,
        )
        await stop.wait()
        app.draining = True  # health turns NOT_SERVING so the proxy stops sending new streams
        started = time.monotonic()
        if cluster is not None:
            await cluster.release()  # a successor takes the lease while we drain
        await until_unrouted(servicer, opts.shutdown_delay)
        log.info("epp_draining", in_flight=servicer.active_streams, grace_seconds=opts.shutdown_grace_period)
        await server.stop(opts.shutdown_grace_period)
        log.info("epp_stopped", drained_seconds=round(time.monotonic() - started, 3))
    await asyncio.to_thread(app.tracing.shutdown)
    return 0


QUIET_BEFORE_CLOSE = 0.5


async def until_unrouted(
    servicer: extproc.ExtProcServicer, limit: float, quiet: float = QUIET_BEFORE_CLOSE
) -> None:
    """Keep the port open after SIGTERM until the proxy stops opening streams (or ``limit``).

    Closing the listener at once fails every request the proxy sends before its health check
    sees NOT_SERVING (or Kubernetes removes the pod from the Service): a leader stepping down
    under load lost ~0.5 s of requests that way.  Under load new streams keep arriving until
    the proxy switches, so a quiet gap is the signal; an idle EPP waits only ``quiet``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    seen, since = servicer.opened, loop.time()
    while (now := loop.time()) < deadline and now - since < quiet:
        await asyncio.sleep(0.05)
        if servicer.opened != seen:
            seen, since = servicer.opened, loop.time()


GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Once started: freeze what startup built and collect the young generation less often.

    The cyclic collector scanned ~10% of the EPP's CPU under load (py-spy, native frames):
    every 700 container allocations a gen-0 pass, and gen-2 passes over the config, plugins,
    stubs and modules that live as long as the process.  Requests make almost no cycles, so
    freezing the startup heap and a larger gen-0 threshold cost little memory.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
