"""What the supervisor tells each worker so the workers of a pod are sync peers (epp.cli.main.sync_args)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from epp.app.options import Options
from epp.cli.main import check_peer_ports, sync_args
from epp.errors import ConfigError
from epp.workers.role import WorkerRole

SYNC_FLAGS = frozenset({"replica-id", "peer-port", "peers", "peers-file"})


def _options(**kw: Any) -> Options:
    values = {"bind_address": "", "peer_port": 9004, "peers": "", "peers_file": "", "replica_id": ""}
    return cast(Options, SimpleNamespace(**{**values, **kw}))


def _role(i: int, n: int = 3) -> WorkerRole:
    return WorkerRole(i, n, Path("/run/epp"), "epp-7f9c")


def test_each_worker_its_port_its_id_and_its_siblings_beside_the_given_peers() -> None:
    extra = sync_args(_options(peers="10.0.0.9:9004"), SYNC_FLAGS)
    assert extra(_role(0)) == [
        "--replica-id=epp-7f9c-w0",
        "--peer-port=9004",  # worker 0 keeps the pod's port: the one other pods list
        "--peers=10.0.0.9:9004,127.0.0.1:9006,127.0.0.1:9008",
    ]
    assert extra(_role(2)) == [
        "--replica-id=epp-7f9c-w2",
        "--peer-port=9008",
        "--peers=10.0.0.9:9004,127.0.0.1:9004,127.0.0.1:9006",
    ]


def test_an_explicit_replica_id_and_bind_address_are_kept() -> None:
    extra = sync_args(_options(replica_id="east", bind_address="::1"), SYNC_FLAGS)
    assert extra(_role(1, 2)) == ["--replica-id=east-w1", "--peer-port=9006", "--peers=[::1]:9004"]


def test_nothing_about_peers_when_sync_is_off_or_peers_come_from_a_file() -> None:
    assert sync_args(_options(peer_port=0), SYNC_FLAGS)(_role(1)) == ["--replica-id=epp-7f9c-w1"]
    assert sync_args(_options(peers_file="/etc/peers"), SYNC_FLAGS)(_role(1)) == ["--replica-id=epp-7f9c-w1"]


def test_no_flags_the_hub_does_not_declare() -> None:
    assert sync_args(_options(), frozenset())(_role(1)) == []


def test_only_worker_0_runs_leader_election() -> None:
    from epp.app.options import DEFAULTS
    from epp.cli.main import worker_options

    opts = dataclasses.replace(DEFAULTS, ha_enable_leader_election=True)
    assert worker_options(opts, _role(0)).ha_enable_leader_election
    assert not worker_options(opts, _role(1)).ha_enable_leader_election


def _ports(**kw: Any) -> Options:
    values = {"peer_port": 9004, "peer_transport": "h2", "grpc_port": 9002, "grpc_health_port": 9003}
    return cast(Options, SimpleNamespace(**{**values, "metrics_port": 9090, **kw}))


def test_the_workers_sync_ports_must_miss_the_pods_other_ports_and_fit_below_65536() -> None:
    check_peer_ports(_ports(), 43)  # 9004, 9006, ... 9088: clear of 9090
    with pytest.raises(ConfigError, match=r"44 workers use sync ports 9004-9090 .* --metrics-port 9090"):
        check_peer_ports(_ports(), 44)
    with pytest.raises(ConfigError, match=r"--grpc-port 9012"):
        check_peer_ports(_ports(grpc_port=9012), 8)
    check_peer_ports(_ports(grpc_port=9013), 8)  # odd ports are free over HTTP/2 ...
    with pytest.raises(ConfigError, match=r"9004-9019 .* --grpc-port 9013"):
        check_peer_ports(_ports(grpc_port=9013, peer_transport="zmq"), 8)  # ... ZMQ's snapshots take them
    with pytest.raises(ConfigError, match=r"past 65535"):
        check_peer_ports(_ports(peer_port=65530), 4)
    check_peer_ports(_ports(peer_port=0, metrics_port=0), 64)  # sync off: no sync ports


def test_epp_refuses_such_workers_before_starting_any() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "epp", "--workers=44", "--endpoints=127.0.0.1:1", "--secure-serving=false"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "epp: --peer-port: 44 workers use sync ports 9004-9090" in done.stderr
    assert "--metrics-port 9090" in done.stderr
