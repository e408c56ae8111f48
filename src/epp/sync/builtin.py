"""The plugin classes this concept contributes to the registry: syncers and peer discovery.

They only carry settings: ``dataLayer.crossReplicaSyncerPluginRef`` names a syncer,
``dataLayer.peerDiscovery.pluginRef`` a peer source; ``assembly.plan`` reads both (with the
command line's ``--peers`` family) into a ``SyncPlan`` the app starts.
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal

from pydantic import Field, field_validator

from epp.config.schema import Duration
from epp.errors import ConfigError
from epp.plugin.base import Handle, NoParams, Plugin, PluginBase, PluginParams
from epp.sync.peers import parse_peer


def _peer_list(value: tuple[str, ...]) -> tuple[str, ...]:
    for i, entry in enumerate(value):
        try:
            parse_peer(entry, f"peers[{i}]")
        except ConfigError as e:
            raise ValueError(str(e)) from None
    return value


class ZmqSyncerParams(PluginParams):
    port: int | None = Field(default=None, ge=0, le=65534)  # None: --peer-port; 0: sync off
    peers: tuple[str, ...] = ()
    peers_file: str = ""
    timeout: Duration | None = None  # None: --peer-timeout
    transport: Literal["h2", "zmq"] | None = None  # None: --peer-transport
    secret_file: str | None = None  # None: --peer-secret-file; "": unauthenticated

    _peers = field_validator("peers")(_peer_list)


class ZmqSyncer(PluginBase):
    """This EPP's cross-replica syncer: deltas over gRPC on the EPP's own HTTP/2 (``transport: h2``,
    the default) or ZMQ PUB/SUB (``zmq``); snapshots on the same port (HTTP/2) or over ZMQ
    ROUTER/DEALER on the next one (ZMQ).  The type keeps its first name: configs name it."""

    TYPE: ClassVar[str] = "zmq-syncer"
    PARAMS: ClassVar[type[PluginParams]] = ZmqSyncerParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, ZmqSyncerParams)
        self.params = params


class LocalSyncer(PluginBase):
    """llm-d-router's only in-tree syncer: state stays in this replica (no peers)."""

    TYPE: ClassVar[str] = "local-syncer"
    PARAMS: ClassVar[type[PluginParams]] = NoParams


class StaticPeerDiscoveryParams(PluginParams):
    peers: tuple[str, ...] = ()
    peers_file: str = ""

    _peers = field_validator("peers")(_peer_list)


class StaticPeerDiscovery(PluginBase):
    """Peers from a list or a file (re-read when it changes), as ``--peers`` / ``--peers-file``."""

    TYPE: ClassVar[str] = "static-peer-discovery"
    PARAMS: ClassVar[type[PluginParams]] = StaticPeerDiscoveryParams

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, StaticPeerDiscoveryParams)
        self.params = params


BUILTINS: Final[tuple[type[Plugin], ...]] = (ZmqSyncer, LocalSyncer, StaticPeerDiscovery)
