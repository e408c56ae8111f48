"""Run the built EPP: start in dependency order, serve until told to stop, drain, stop in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time

import grpc
import structlog

from epp import __version__
from epp.app.build import parser_supports
from epp.app.compose import App
from epp.app.debug import debug_state
from epp.app.options import Options
from epp.app.reload import ConfigReloader
from epp.datalayer.pool_metrics import PoolMetrics
from epp.health.shared import EXCHANGE
from epp.k8s.cluster import Cluster
from epp.k8s.leader import Timings
from epp.k8s.peers import K8sPeerDiscovery
from epp.metrics import fast, series
from epp.metrics.exporter import MetricsServer
from epp.metrics.llmd import parse_families
from epp.server import extproc, health
from epp.server.h2.limits import H2Limits
from epp.server.peering import transport_for
from epp.server.transport import Tls, make_server
from epp.sync.peers import PeerSource, PodWorkers, UnionPeers
from epp.sync.service import SyncService
from epp.workers.balance import ConnectionBalance
from epp.workers.role import WorkerRole
from epp.workers.siblings import Siblings, WorkerSeries

log = structlog.get_logger(__name__)


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


async def _peer_source(
    app: App, cluster: Cluster | None, role: WorkerRole | None, stack: contextlib.AsyncExitStack
) -> PeerSource:
    """The hub's peers: the command line's (a pod's own workers among them), plus the pods a
    platform discovery plugin watches, each expanded to its workers."""
    assert app.sync is not None
    assert app.peers is not None
    discovery = app.sync.discovery
    if discovery is None:
        return app.peers
    # build_app admitted only k8s-peer-discovery, and only in Kubernetes mode
    assert isinstance(discovery, K8sPeerDiscovery)
    assert cluster is not None
    assert cluster.kube is not None
    pods = await stack.enter_async_context(discovery.source(cluster.kube, app.env))
    count = role.count if role is not None else 1
    return UnionPeers(PodWorkers(pods, count) if count > 1 else pods, app.peers)


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
            and (app.sync is None or (app.sync_hub is not None and app.sync_hub.serving))
        )

    role = WorkerRole.from_env(app.env)  # --workers N: which worker this is (docs/workers.md)
    primary = role is not None and role.primary and role.count > 1
    siblings = (
        Siblings(role, own_ready=ready, synced=app.sync is not None) if primary and role is not None else None
    )

    def pod_ready() -> bool:  # worker 0 answers for the pod: a quorum of workers must be ready
        own = ready()
        return own and (siblings is None or siblings.quorate(own))

    cluster = _cluster(app)
    if cluster is not None:
        await cluster.connect()  # a bad kubeconfig fails here, before anything starts
    health_servicer = health.HealthServicer(
        pod_ready,
        leader_election=opts.ha_enable_leader_election,
        leader=cluster.is_leader if cluster is not None else lambda: True,
    )
    async with contextlib.AsyncExitStack() as stack:
        # histograms fold on the loop, not in a thread that would wake at each GIL release
        stack.callback(fast.fold_on(asyncio.get_running_loop()))
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
        if app.sync is not None and app.peers is not None:  # warm start: peers' state before ready
            peers = await _peer_source(app, cluster, role, stack)
            sibling_ports = role.sibling_peer_ports(app.sync.port) if role is not None else frozenset()
            app.sync_hub = await stack.enter_async_context(
                SyncService(
                    app.sync,
                    peers,
                    [*app.components.plugins.values(), EXCHANGE],
                    transport_for(
                        app.sync.transport, app.sync.bind_host, app.sync.port, secret=app.peer_secret
                    ),
                    sibling_ports,
                    secret=app.peer_secret,
                )
            )
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
        servicer = extproc.ExtProcServicer(
            app.director, max_body_bytes=opts.max_request_body_bytes, tracing=app.tracing
        )
        if siblings is not None:
            await stack.enter_async_context(siblings)
        # --workers N on our own HTTP/2: connections spread by count, not by SO_REUSEPORT's hash
        balance = (
            ConnectionBalance(role, opened=lambda: servicer.opened)
            if role is not None and opts.ext_proc_transport == "h2"
            else None
        )
        if role is not None:
            worker_series = WorkerSeries(role, lambda: servicer.opened, balance)
            series.REGISTRY.register(worker_series)
            stack.callback(series.REGISTRY.unregister, worker_series)
        local = role is not None and not role.primary  # siblings-only /metrics: a 0700 run dir guards it
        metrics_server = await stack.enter_async_context(
            MetricsServer(
                opts.bind_address,
                opts.metrics_port,
                unix_path=str(role.metrics_socket()) if local and role is not None else "",
                ready=ready if role is not None else None,
                siblings=siblings,
                enable_pprof=opts.enable_pprof,
                authorize=None if local else authorize,
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

        health_port = 0
        if role is None or role.primary:  # one health endpoint per pod
            health_server = grpc.aio.server()
            health.add_to_server(health_servicer, health_server)
            health_port = health_server.add_insecure_port(_address(opts, opts.grpc_health_port))
            await health_server.start()
            stack.push_async_callback(health_server.stop, 0)

        limits = H2Limits(
            max_concurrent_streams=opts.grpc_max_concurrent_streams,
            max_message_bytes=opts.grpc_max_message_bytes,
            keepalive_time=opts.grpc_keepalive_time,
            keepalive_timeout=opts.grpc_keepalive_timeout,
            idle_timeout=opts.grpc_max_connection_idle,
        )
        hub = app.sync_hub
        server = make_server(
            opts.ext_proc_transport,
            servicer,
            health_servicer if opts.health_checking else None,
            limits,
            # peers' sync messages read in the wakes requests give the loop, not in wakes of their own
            awake=hub.transport.ride if hub is not None and hub.transport.wants_rides else None,
        )
        tls = Tls(opts.cert_path, opts.enable_cert_reload) if opts.secure_serving else None
        grpc_port = await server.start(
            opts.bind_address, opts.grpc_port, tls, reuse_port=role is not None, placement=balance
        )
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
        log.info("epp_draining", in_flight=servicer.active_sessions, grace_seconds=opts.shutdown_grace_period)
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
