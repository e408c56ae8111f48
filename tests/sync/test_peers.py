"""Peer lists: parsing with errors that name the entry, dropping this replica, the update stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from epp.errors import ConfigError
from epp.sync.peers import Peer, PodWorkers, StaticPeers, UnionPeers, parse_peers, without_self


def test_entries_by_comma_or_line_with_comments_and_ipv6() -> None:
    text = "# the EPP replicas\nepp-0.epp:9004, epp-1.epp:9004\n\n[fd00::1]:9004  # v6\nepp-0.epp:9004\n"
    peers = parse_peers(text, "peers.txt")
    assert peers == (
        Peer("epp-0.epp:9004", "epp-0.epp", 9004),
        Peer("epp-1.epp:9004", "epp-1.epp", 9004),
        Peer("fd00::1:9004", "fd00::1", 9004),
    )
    assert peers[2].endpoint(1) == "tcp://[fd00::1]:9005"


@pytest.mark.parametrize("bad", ["epp-0", "epp-0:", ":9004", "epp-0:port", "epp-0:0", "epp-0:70000"])
def test_a_bad_entry_is_an_error_naming_where(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--peers: invalid peer"):
        parse_peers(f"a:1,{bad}", "--peers")
    with pytest.raises(ConfigError, match=r"peers.txt line 2: invalid peer"):
        parse_peers(f"a:1\n{bad}\n", "peers.txt")


def test_own_address_is_dropped_by_port_and_host() -> None:
    peers = parse_peers("127.0.0.1:9004,127.0.0.1:9006,other:9004", "--peers")
    kept = without_self(peers, 9004, frozenset({"127.0.0.1", "localhost"}))
    assert [p.id for p in kept] == ["127.0.0.1:9006", "other:9004"]


async def test_updates_yield_the_current_set_then_each_change() -> None:
    source = StaticPeers(parse_peers("a:1", "x"))
    updates = source.updates()
    assert [p.id for p in await anext(updates)] == ["a:1"]
    waiting = asyncio.ensure_future(anext(updates))
    source.set(parse_peers("a:1", "x"))  # unchanged: no update
    source.set(parse_peers("a:1,b:2", "x"))
    assert [p.id for p in await asyncio.wait_for(waiting, 5)] == ["a:1", "b:2"]


class _Feed:
    """A PeerSource whose sets the test pushes."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Peer, ...]] = asyncio.Queue()

    async def updates(self) -> AsyncIterator[tuple[Peer, ...]]:
        while True:
            yield await self.queue.get()


def _p(name: str, port: int = 9004) -> Peer:
    return Peer(id=name, host=f"10.0.0.{len(name)}", port=port)


async def test_union_waits_for_every_source_then_follows_each() -> None:
    pods, workers = _Feed(), _Feed()
    it = UnionPeers(pods, workers).updates()
    first = asyncio.ensure_future(anext(it))
    pods.queue.put_nowait((_p("a"),))
    await asyncio.sleep(0)  # one source alone: nothing yet
    assert not first.done()
    workers.queue.put_nowait((_p("w1", 9006),))
    assert await first == tuple(sorted((_p("a"), _p("w1", 9006))))
    pods.queue.put_nowait((_p("a"), _p("bb")))
    assert await anext(it) == tuple(sorted((_p("a"), _p("bb"), _p("w1", 9006))))
    await it.aclose()


async def test_pod_workers_expands_each_pod_to_its_workers_ports() -> None:
    pods = _Feed()
    it = PodWorkers(pods, 3).updates()
    pods.queue.put_nowait((_p("epp-a"),))
    got = await anext(it)
    assert [(p.id, p.port) for p in got] == [("epp-a", 9004), ("epp-a-w1", 9006), ("epp-a-w2", 9008)]
    await it.aclose()
