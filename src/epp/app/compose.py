"""Compose the EPP from Options and its config file: everything built (all or nothing), nothing started.

``build_app`` loads the config, has ``build`` hand each concept its section, and completes what
the concepts returned with what only the command line knows: the datastore and how it is filled
(``--endpoints``, ``--endpoints-file``, ``--objectives-file`` or Kubernetes), the polling
interval and the request pipeline's tuning.  ``serve`` (``serve.py``) starts the result.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.admission.api import AdmissionController
from epp.app.build import BuildOptions, Components, build
from epp.app.options import Options
from epp.app.registry import default_registry
from epp.config.load import load
from epp.datalayer.runtime import DataLayerRuntime
from epp.datastore.objects import apply_objects, load_objects
from epp.datastore.static import endpoints_from_pairs, load_endpoints_file
from epp.datastore.store import Datastore, PoolInfo
from epp.datastore.watch import WatchedFile
from epp.director.director import Director
from epp.errors import ConfigError
from epp.explain.record import DecisionRing
from epp.k8s.discovery import DiscoverySpec
from epp.k8s.peers import K8sPeerDiscovery
from epp.sync import assembly as sync_assembly
from epp.sync.assembly import SyncPlan
from epp.sync.hub import SyncHub
from epp.sync.peers import parse_peers
from epp.sync.secret import PeerSecret, parse_secrets
from epp.sync.service import PeerList
from epp.tracing.otel import Tracing, setup_tracing


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
    # cross-replica sync (epp.sync): what to run, the peer set, and the hub once serve() started it
    sync: SyncPlan | None = None
    peers: PeerList | None = None
    peer_secret: PeerSecret | None = None  # what peers must present (--peer-secret-file), watched
    sync_hub: SyncHub | None = None
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


def _sync(
    options: Options, components: Components, env: Mapping[str, str], watched: list[WatchedFile[Any]]
) -> tuple[SyncPlan | None, PeerList | None]:
    """Active-active sync: the plan from the config's dataLayer refs and the --peers flags, and
    the peer set (a --peers-file is loaded now, so a bad one fails startup, and watched)."""
    if options.peers and options.peers_file:
        raise ConfigError("--peers-file: give either --peers or --peers-file, not both")
    replica_id = options.replica_id or env.get("POD_NAME") or f"{socket.gethostname()}:{os.getpid()}"
    flags = sync_assembly.SyncFlags(
        replica_id=replica_id,
        port=options.peer_port,
        peers=parse_peers(options.peers, "--peers"),
        peers_file=options.peers_file,
        timeout=options.peer_timeout,
        bind_host=options.bind_address,
        transport=options.peer_transport,
        secret_file=options.peer_secret_file,
    )
    plan = sync_assembly.plan(components.config.data_layer, components.plugins, flags)
    if plan is None:
        return None, None
    if plan.discovery is not None:  # checked here, so a bad pairing fails before anything starts
        where = sync_assembly.DISCOVERY_REF
        if not isinstance(plan.discovery, K8sPeerDiscovery):
            raise ConfigError(f"{where}: '{plan.discovery}' is no peer discovery this EPP can watch")
        if not (options.pool_name or options.endpoint_selector):
            raise ConfigError(
                f"{where}: k8s-peer-discovery needs Kubernetes (--pool-name or --endpoint-selector); "
                "without it give --peers or --peers-file"
            )
    peers = PeerList(plan.port, plan.peers)
    if plan.peers_file:
        path = plan.peers_file
        wf = WatchedFile(path, lambda text: parse_peers(text, path), peers.set, what="peers file")
        wf.load_now()
        watched.append(wf)
    return plan, peers


def _peer_secret(path: str, watched: list[WatchedFile[Any]]) -> PeerSecret:
    """The secrets of ``path``, loaded now (a missing or bad file fails startup) and watched: a
    change swaps them in place, and the transport re-authenticates its connections."""
    secret: PeerSecret | None = None

    def install(secrets: tuple[bytes, ...]) -> None:
        nonlocal secret
        if secret is None:
            secret = PeerSecret(secrets)
        else:
            secret.set(secrets)

    source = "--peer-secret-file"
    wf = WatchedFile(path, lambda text: parse_secrets(text, f"{source} {path}"), install, what=source)
    wf.load_now()
    watched.append(wf)
    assert secret is not None
    return secret


def build_app(options: Options, env: Mapping[str, str]) -> App:
    """Validate and build every component; raises ConfigError and starts nothing.

    ``build`` hands each concept its section of the config; here the objects the
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
    sync, peers = _sync(options, components, env, watched)
    secret = _peer_secret(sync.secret_file, watched) if sync is not None and sync.secret_file else None
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
        sync=sync,
        peers=peers,
        peer_secret=secret,
    )
