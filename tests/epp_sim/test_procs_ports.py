"""The test processes' port helpers never hand the same port out twice while it is remembered."""

from __future__ import annotations

import socket

import pytest

from epp_sim.demo import procs
from epp_sim.demo.procs import free_port, free_port_pair, free_port_run, free_ports


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


def test_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    # A port in the ephemeral range can be taken by any outgoing connection between being handed
    # out and being bound (CI: an EPP's pre-picked gRPC port was in use when it bound).
    low = procs._ephemeral_low()
    ports = [*free_ports(20), free_port_pair()]
    assert all(procs.LOW_PORT <= p < low for p in ports)


def test_xdist_workers_have_disjoint_slices_and_others_do_not_share_theirs() -> None:
    slices = 20
    workers = [procs._slice_index(f"gw{i}", 4242, slices) for i in range(16)]
    assert workers == list(range(16))
    others = {procs._slice_index(None, pid, slices) for pid in range(1000, 1100)}
    assert others == {16, 17, 18, 19}
    assert procs._slice_index("master", 7, 4) == 3  # not a worker: by pid, whatever the count


def test_the_cursor_goes_round_the_slice_and_skips_ports_in_use() -> None:
    ports = procs._Ports(*_a_free_range(8))
    first = ports.take(4)
    with socket.socket() as held:
        held.bind(("127.0.0.1", first[0] + 4))  # the next one the cursor would give
        second = ports.take(3)
    assert first == list(range(first[0], first[0] + 4))
    assert second == [first[0] + 5, first[0] + 6, first[0] + 7]
    assert ports.take(1) == [first[0]]  # round again, the oldest first


def test_a_run_of_ports_is_handed_out_whole() -> None:
    # an EPP with --workers 3 binds --peer-port and the five ports after it
    base = free_port_run(6)
    after = free_ports(40)
    assert not set(after) & set(range(base, base + 6))


def test_a_full_slice_is_an_error_naming_the_range() -> None:
    low, high = _a_free_range(2)
    ports = procs._Ports(low, high)
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", low))
        b.bind(("127.0.0.1", low + 1))
        with pytest.raises(RuntimeError, match=f"no 1 free ports in {low}-{low + 1}"):
            ports.take(1)


def test_with_no_room_below_the_ephemeral_range_the_kernel_hands_them_out() -> None:
    ports = procs._Ports(0, 0)
    handed = [p for _ in range(50) for p in ports.take(2)] + ports.take(10, consecutive=2)
    assert len(handed) == len(set(handed))
    assert all(p >= 1024 for p in handed)


def _a_free_range(n: int) -> tuple[int, int]:
    """``n`` consecutive ports free now, from the top of this process's own slice (not handed out)."""
    top = procs._PORTS._high
    for low in range(top - n, top - 200, -n):
        if all(procs.bindable(p) for p in range(low, low + n)):
            return low, low + n
    raise AssertionError("no free range")
