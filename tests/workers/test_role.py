"""``EPP_WORKER``: the role the supervisor hands each worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.workers.role import ENV, WorkerRole


def test_round_trip_and_derived_names() -> None:
    role = WorkerRole(1, 3, Path("/run/epp"), "epp-abc")
    back = WorkerRole.from_env({ENV: role.to_env()})
    assert back == role
    assert not role.primary and WorkerRole(0, 3, Path("/run/epp"), "epp-abc").primary
    assert role.replica_id == "epp-abc-w1"
    assert role.siblings == (0, 2)
    assert role.peer_port(9004) == 9006 and role.peer_port(9004, 0) == 9004
    assert role.metrics_socket() == Path("/run/epp/w1.metrics.sock")
    assert (
        role.handoff_socket() == Path("/run/epp/w1.conns.sock")
        and role.handoff_socket(2).name == "w2.conns.sock"
    )
    assert role.scrape_share == "connect:ipc:///run/epp/scrapes.pub"
    assert WorkerRole(0, 3, Path("/run/epp"), "p").scrape_share == "bind:ipc:///run/epp/scrapes.pub"
    assert role.sibling_peer_ports(role.peer_port(9004)) == {9004, 9008}  # workers 0 and 2


def test_absent_means_single_process() -> None:
    assert WorkerRole.from_env({}) is None


@pytest.mark.parametrize(
    "raw", ["nope", '{"index": 0}', '{"index": 3, "count": 2, "run_dir": "/x", "replica": "p"}']
)
def test_bad_role_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=ENV):
        WorkerRole.from_env({ENV: raw})
