"""What the supervisor tells each worker so the workers of a pod are sync peers (epp.cli.main.sync_args)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from epp.app.options import Options
from epp.cli.main import sync_args
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
