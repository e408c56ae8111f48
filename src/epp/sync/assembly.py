"""What to sync and with whom: the config's ``dataLayer`` refs and the ``--peers`` flags → ``SyncPlan``.

Precedence, most specific first: a static peer-discovery plugin's peers, then the syncer's
``peers``/``peersFile``, then ``--peers``/``--peers-file``; the syncer's ``port``, ``timeout``,
``transport`` and ``secretFile`` over ``--peer-port``/``--peer-timeout``/``--peer-transport``/
``--peer-secret-file``.  A platform
discovery plugin (``k8s-peer-discovery``) adds the peers it watches to the others (a pod's own workers come
from the command line).  Sync runs when a ``zmq-syncer`` is
configured (it then also serves peers that list it) or peers are given on the command line,
and the port is not 0.  ``local-syncer`` (llm-d's in-tree mock) means no sharing at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.config.schema import DataLayerConfig
from epp.errors import ConfigError
from epp.plugin.base import Plugin
from epp.sync.builtin import LocalSyncer, StaticPeerDiscovery, ZmqSyncer
from epp.sync.peers import Peer, parse_peer

SYNCER_REF = "dataLayer.crossReplicaSyncerPluginRef"
DISCOVERY_REF = "dataLayer.peerDiscovery.pluginRef"


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncFlags:
    """The command line's say (``--peers``, ``--peers-file``, ``--peer-port``, ``--peer-timeout``)."""

    replica_id: str
    port: int
    peers: tuple[Peer, ...] = ()
    peers_file: str = ""
    timeout: float = 1.0
    bind_host: str = ""
    transport: str = "h2"
    secret_file: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncPlan:
    """Everything the hub needs; ``peers_file`` (when set) replaces ``peers`` and is watched."""

    replica_id: str
    port: int
    peers: tuple[Peer, ...]
    peers_file: str
    timeout: float
    interval: float
    bind_host: str
    transport: str = "h2"  # "h2" (epp.server.peering) or "zmq" (epp.sync.transport)
    secret_file: str = ""  # shared secrets a peer must present (epp.sync.secret); "": none
    # A discovery plugin that watches the platform (``k8s-peer-discovery``): the app, which
    # holds the Kubernetes client, turns it into a PeerSource; its peers join ``peers``.
    discovery: object | None = None


def _ref(plugins: Mapping[str, object], name: str, path: str, *kinds: type[Plugin]) -> object:
    plugin = plugins.get(name)
    if plugin is None:
        raise ConfigError(f"{path}: plugin '{name}' is not defined under plugins")
    if not isinstance(plugin, kinds):
        wanted = " or ".join(f"'{k.TYPE}'" for k in kinds)
        raise ConfigError(f"{path}: plugin '{name}' is a '{getattr(plugin, 'TYPE', '?')}', expected {wanted}")
    return plugin


def plan(
    data_layer: DataLayerConfig | None, plugins: Mapping[str, object], flags: SyncFlags
) -> SyncPlan | None:
    """The sync to run, or None; a bad reference or a contradiction is a ConfigError naming the field."""
    syncer_ref = data_layer.cross_replica_syncer_plugin_ref if data_layer is not None else ""
    discovery = data_layer.peer_discovery if data_layer is not None else None
    interval = (data_layer.cross_replica_sync_interval if data_layer is not None else None) or 0.0
    syncer = _ref(plugins, syncer_ref, SYNCER_REF, ZmqSyncer, LocalSyncer) if syncer_ref else None
    if isinstance(syncer, LocalSyncer):
        if flags.peers or flags.peers_file or discovery is not None:
            raise ConfigError(
                f"{SYNCER_REF}: '{syncer_ref}' is a local-syncer (no peers) but peers are given "
                "(--peers, --peers-file or dataLayer.peerDiscovery); use a zmq-syncer"
            )
        return None
    peers, peers_file = flags.peers, flags.peers_file
    port, timeout, transport, secret_file = flags.port, flags.timeout, flags.transport, flags.secret_file
    if isinstance(syncer, ZmqSyncer):
        p = syncer.params
        transport = p.transport or transport
        secret_file = p.secret_file if p.secret_file is not None else secret_file
        if p.peers or p.peers_file:
            peers = tuple(parse_peer(s, f"{syncer_ref}.peers[{i}]") for i, s in enumerate(p.peers))
            peers_file = p.peers_file
        port = p.port if p.port is not None else port
        timeout = p.timeout if p.timeout is not None else timeout
    dynamic: object | None = None
    if discovery is not None:
        found = plugins.get(discovery.plugin_ref)
        if (
            found is not None
            and not isinstance(found, StaticPeerDiscovery)
            and callable(getattr(found, "source", None))
        ):
            dynamic = found  # peers from the platform, beside the command line's (a pod's workers)
        else:
            source = _ref(plugins, discovery.plugin_ref, DISCOVERY_REF, StaticPeerDiscovery)
            assert isinstance(source, StaticPeerDiscovery)
            peers = tuple(
                parse_peer(s, f"{discovery.plugin_ref}.peers[{i}]") for i, s in enumerate(source.params.peers)
            )
            peers_file = source.params.peers_file
    if syncer is None and not (peers or peers_file or dynamic):
        return None
    if port == 0:
        if peers or peers_file or dynamic:
            raise ConfigError(
                "--peer-port: 0 turns sync off, but peers are given; set a port or drop the peers"
            )
        return None
    if timeout <= 0:
        raise ConfigError("--peer-timeout: must be positive")
    return SyncPlan(
        replica_id=flags.replica_id,
        port=port,
        peers=peers,
        peers_file=peers_file,
        timeout=timeout,
        interval=interval,
        bind_host=flags.bind_host,
        transport=transport,
        secret_file=secret_file,
        discovery=dynamic,
    )
