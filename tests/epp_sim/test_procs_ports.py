"""The test processes' port helpers never hand the same port out twice while it is remembered."""

from __future__ import annotations

import socket

from epp_sim.demo.procs import free_port, free_port_pair, free_ports


def test_ports_asked_for_one_after_another_are_all_distinct() -> None:
    # Each port is released before the next is asked for, so the kernel is free to give it again
    # (it did in CI: one EPP's gRPC port was another's metrics port); the helpers must not.
    handed = [free_port() for _ in range(300)]
    handed += [p for _ in range(100) for p in free_ports(3)]
    pairs = [free_port_pair() for _ in range(50)]
    handed += pairs + [p + 1 for p in pairs]
    assert len(handed) == len(set(handed))


def test_a_handed_out_port_is_free_to_bind() -> None:
    for port in free_ports(4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    port = free_port_pair()
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", port))
        b.bind(("127.0.0.1", port + 1))
