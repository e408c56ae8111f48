"""The sync plan from the config's dataLayer refs (llm-d's names) and the --peers flags."""

from __future__ import annotations

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.errors import ConfigError
from epp.sync.assembly import SyncFlags, plan
from epp.sync.peers import parse_peers

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
FLAGS = SyncFlags(replica_id="me", port=9004)


def _plan(text: str, flags: SyncFlags = FLAGS) -> object:
    config = load_config(text)
    components = build(config, default_registry(entry_points=False))
    return plan(config.data_layer, components.plugins, flags)


def test_llm_d_config_names_a_zmq_syncer_its_interval_and_peer_discovery() -> None:
    p = _plan(
        LLMD + "plugins:\n"
        "- {name: sync, type: zmq-syncer, parameters: {port: 7000, timeout: 500ms}}\n"
        "- {name: peers, type: static-peer-discovery, parameters: {peers: ['epp-1:7000', 'epp-2:7000']}}\n"
        "dataLayer:\n  crossReplicaSyncerPluginRef: sync\n  crossReplicaSyncInterval: 200ms\n"
        "  peerDiscovery: {pluginRef: peers}\n"
    )
    assert p is not None
    assert (p.port, p.timeout, p.interval) == (7000, 0.5, 0.2)  # type: ignore[attr-defined]
    assert [x.id for x in p.peers] == ["epp-1:7000", "epp-2:7000"]  # type: ignore[attr-defined]


def test_a_zmq_syncer_alone_serves_peers_that_list_it() -> None:
    p = _plan(LLMD + "plugins:\n- {type: zmq-syncer}\ndataLayer: {crossReplicaSyncerPluginRef: zmq-syncer}\n")
    assert p is not None and p.port == 9004 and p.peers == ()  # type: ignore[attr-defined]


def test_flags_alone_turn_sync_on_and_nothing_leaves_it_off() -> None:
    assert _plan(LLMD) is None
    flags = SyncFlags(replica_id="me", port=9004, peers=parse_peers("a:9004", "--peers"))
    p = _plan(LLMD, flags)
    assert p is not None and [x.id for x in p.peers] == ["a:9004"]  # type: ignore[attr-defined]


def test_the_syncers_peers_win_over_the_flags() -> None:
    flags = SyncFlags(replica_id="me", port=9004, peers=parse_peers("a:9004", "--peers"), timeout=3.0)
    p = _plan(
        LLMD + "plugins:\n- {type: zmq-syncer, parameters: {peers: ['b:9004']}}\n"
        "dataLayer: {crossReplicaSyncerPluginRef: zmq-syncer}\n",
        flags,
    )
    assert p is not None and [x.id for x in p.peers] == ["b:9004"] and p.timeout == 3.0  # type: ignore[attr-defined]


def test_local_syncer_means_no_sharing_and_contradicting_peers_are_an_error() -> None:
    text = LLMD + "plugins:\n- {type: local-syncer}\ndataLayer: {crossReplicaSyncerPluginRef: local-syncer}\n"
    assert _plan(text) is None
    flags = SyncFlags(replica_id="me", port=9004, peers=parse_peers("a:9004", "--peers"))
    with pytest.raises(ConfigError, match="crossReplicaSyncerPluginRef: 'local-syncer' is a local-syncer"):
        _plan(text, flags)


@pytest.mark.parametrize(
    ("data_layer", "plugins", "error"),
    [
        (
            "{crossReplicaSyncerPluginRef: nope}",
            "[]",
            r"crossReplicaSyncerPluginRef: plugin 'nope' is not defined",
        ),
        (
            "{crossReplicaSyncerPluginRef: queue-scorer}",
            "[{type: queue-scorer}]",
            r"plugin 'queue-scorer' is a 'queue-scorer', expected 'zmq-syncer' or 'local-syncer'",
        ),
        (
            "{peerDiscovery: {pluginRef: nope}}",
            "[]",
            r"peerDiscovery.pluginRef: plugin 'nope' is not defined",
        ),
    ],
)
def test_bad_references_name_the_field(data_layer: str, plugins: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _plan(LLMD + f"plugins: {plugins}\ndataLayer: {data_layer}\n")


def test_bad_syncer_parameters_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"peers.*invalid peer 'nohost'"):
        _plan(LLMD + "plugins:\n- {type: zmq-syncer, parameters: {peers: [nohost]}}\n")
    with pytest.raises(ConfigError, match=r"crossReplicaSyncInterval"):
        load_config(LLMD + "dataLayer: {crossReplicaSyncInterval: soon}\n")


def test_port_zero_with_peers_is_an_error() -> None:
    flags = SyncFlags(replica_id="me", port=0, peers=parse_peers("a:9004", "--peers"))
    with pytest.raises(ConfigError, match="--peer-port: 0 turns sync off"):
        _plan(LLMD, flags)


def test_the_syncers_secret_file_wins_over_the_flag() -> None:
    flags = SyncFlags(replica_id="me", port=9004, secret_file="/flag/secret")
    p = _plan(
        LLMD + "plugins:\n- {type: zmq-syncer}\ndataLayer: {crossReplicaSyncerPluginRef: zmq-syncer}\n", flags
    )
    assert p is not None and p.secret_file == "/flag/secret"  # type: ignore[attr-defined]
    text = "plugins:\n- {type: zmq-syncer, parameters: {secretFile: /etc/epp/peer-secret/token}}\n"
    p = _plan(LLMD + text + "dataLayer: {crossReplicaSyncerPluginRef: zmq-syncer}\n", flags)
    assert p is not None and p.secret_file == "/etc/epp/peer-secret/token"  # type: ignore[attr-defined]
    p = _plan(
        LLMD
        + text.replace("/etc/epp/peer-secret/token", "''")
        + "dataLayer: {crossReplicaSyncerPluginRef: zmq-syncer}\n",
        flags,
    )
    assert p is not None and p.secret_file == ""  # type: ignore[attr-defined]  # "": unauthenticated on purpose
