"""``siblings``: which peers are workers of this pod, from their sync ports (``WorkerRole``)."""

from __future__ import annotations

from pathlib import Path

from epp.sync.peers import Peer
from epp.sync.service import siblings
from epp.workers.role import PEER_PORT_STRIDE, WorkerRole


def test_outside_a_supervised_pod_no_peer_is_a_sibling() -> None:
    assert siblings(frozenset()) is None


def test_siblings_are_this_hosts_worker_ports_and_nothing_else() -> None:
    role = WorkerRole(1, 3, Path("/run/epp"), "pod")
    is_sibling = siblings(role.sibling_peer_ports(role.peer_port(9004)))
    assert is_sibling is not None
    assert is_sibling(Peer("w0", "127.0.0.1", 9004))
    assert is_sibling(Peer("w2", "::1", 9004 + 2 * PEER_PORT_STRIDE))
    assert not is_sibling(Peer("me", "127.0.0.1", 9006))  # its own port is no sibling's
    assert not is_sibling(Peer("w3", "127.0.0.1", 9010))  # past the pod's workers
    assert not is_sibling(Peer("other-pod", "10.9.9.9", 9004))  # the same port on another pod
