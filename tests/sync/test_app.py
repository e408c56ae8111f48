"""The app's wiring: flags → sync plan, the peers file, readiness after the warm start."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import aiohttp
import pytest

from bench import extproc_client as xc
from epp.app import compose, reload
from epp.app.compose import build_app
from epp.app.options import Options
from epp.app.registry import default_registry
from epp.app.serve import serve
from epp.cli.flags import parse_flags
from epp.errors import ConfigError
from epp.plugin.registry import Registry
from epp.server.peering import H2Transport
from epp.sync.peers import Peer
from epp.sync.secret import PeerSecret
from epp.sync.transport import ZmqTransport
from epp.testing.replicated import SNAPSHOT_ORIGIN, PolledCounter, RoutedCounter
from epp.testing.waiting import until
from epp_sim.demo.procs import free_port, free_port_pair
from tests.sync.conftest import mesh

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {name: counter, type: test-routed-counter}
"""
BASE = ("--endpoints=127.0.0.1:1", "--secure-serving=false", "--tracing=false", "--bind-address=127.0.0.1")


@pytest.fixture(autouse=True)
def counter_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The production registry plus the test plugin (as an installed entry point would add it)."""

    def registry(*, entry_points: bool = True) -> Registry:
        r = default_registry(entry_points=entry_points)
        r.register(RoutedCounter)
        r.register(PolledCounter)
        return r

    monkeypatch.setattr(compose, "default_registry", registry)
    monkeypatch.setattr(reload, "default_registry", registry)


def test_peers_flags_make_a_plan_with_this_replicas_id() -> None:
    opts = parse_flags([*BASE, "--peers=127.0.0.1:9100,127.0.0.1:9004", f"--config-text={CONFIG}"], {})
    app = build_app(opts, {"POD_NAME": "epp-7d9f-x"})
    assert app.sync is not None and app.peers is not None
    assert app.sync.replica_id == "epp-7d9f-x"
    assert [p.id for p in app.peers.peers] == ["127.0.0.1:9100"]  # its own address (9004) skipped


def test_no_peers_no_sync_and_both_lists_is_an_error(tmp_path: pathlib.Path) -> None:
    assert build_app(parse_flags([*BASE], {}), {}).sync is None
    (tmp_path / "peers").write_text("a:1\n")
    both = parse_flags([*BASE, "--peers=a:1", f"--peers-file={tmp_path / 'peers'}"], {})
    with pytest.raises(ConfigError, match="--peers-file: give either --peers or --peers-file"):
        build_app(both, {})
    with pytest.raises(ConfigError, match="--peers: invalid peer 'a'"):
        parse_flags([*BASE, "--peers=a"], {})


def test_a_bad_peers_file_fails_startup_and_a_good_one_is_watched(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "peers"
    path.write_text("# replicas\nepp-1:9004\nbroken\n")
    with pytest.raises(ConfigError, match=r"peers line 3: invalid peer 'broken'"):
        build_app(parse_flags([*BASE, f"--peers-file={path}"], {}), {})
    path.write_text("# replicas\nepp-1:9004\nepp-2:9004\n")
    app = build_app(parse_flags([*BASE, f"--peers-file={path}"], {}), {})
    assert app.peers is not None and [p.id for p in app.peers.peers] == ["epp-1:9004", "epp-2:9004"]
    assert any(w.path == str(path) for w in app.watched)


def new_replica(
    warm_port: int,
    port: int,
    *config: str,
    metrics_port: int = 0,
    grpc_port: int = 0,
    transport: str = "h2",
) -> Options:
    """Flags of a replica "new" whose one peer is the warm replica; ``config`` defaults to CONFIG."""
    return parse_flags(
        [
            *BASE,
            f"--grpc-port={grpc_port}",
            "--grpc-health-port=0",
            f"--metrics-port={metrics_port}",
            "--metrics-endpoint-auth=false",
            *(config or (f"--config-text={CONFIG}",)),
            f"--peers=127.0.0.1:{warm_port}",
            f"--peer-port={port}",
            "--replica-id=new",
            f"--peer-transport={transport}",
        ],
        {},
    )


async def test_ready_only_after_restoring_a_serving_peers_view() -> None:
    async with mesh(["warm"], kind="h2") as (warm,):
        warm.counter.count("e1", 5)
        port = free_port_pair()
        opts = new_replica(warm.hub.transport.port, port)
        app = build_app(opts, {})
        stop = asyncio.Event()
        task = asyncio.create_task(serve(app, stop=stop))
        try:
            await until(lambda: app.serving or task.done(), 20, what="the EPP serving")
            assert not task.done()
            # the first moment it could report ready, the peer's view is already here
            hub = app.sync_hub
            assert hub is not None and hub.serving and hub.restored_from == "warm"
            (counter,) = (p for p in app.components.plugins.values() if isinstance(p, RoutedCounter))
            assert counter.learned[SNAPSHOT_ORIGIN] == {"e1": 5}
            warm.peers.set([Peer("new", "127.0.0.1", port)])  # the peer's list gains the new replica
            counter.count("e2", 2)  # and its own routing reaches the peer
            await until(lambda: warm.hub.connected == 1, 5, what="warm hears new")
            counter.count("e2", 2)  # sent once warm's SUB is connected (a PUB drops before)
            await until(lambda: warm.counter.learned.get("new") == {"e2": 4}, 5, what="warm learns new")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def test_a_live_reload_rebinds_the_hub_to_the_new_plugins(tmp_path: pathlib.Path) -> None:
    async with mesh(["warm"], kind="h2") as (warm,):
        polled = PolledCounter("polled")
        warm.hub.bind([warm.counter, polled])
        port = free_port_pair()
        path = tmp_path / "config.yaml"
        path.write_text(CONFIG)
        opts = new_replica(
            warm.hub.transport.port, port, "--config-reload-interval=50ms", f"--config-file={path}"
        )
        app = build_app(opts, {})
        stop = asyncio.Event()
        task = asyncio.create_task(serve(app, stop=stop))
        try:
            await until(lambda: app.serving or task.done(), 20, what="the EPP serving")
            hub = app.sync_hub
            # the config's shared plugin, and the pod's shared ejections (epp.health.shared)
            assert hub is not None and sorted(hub.plugins) == [
                "epp/endpoint-health",
                "test-routed-counter/counter",
            ]
            kept = hub.plugins["test-routed-counter/counter"]
            path.write_text(CONFIG + "- {name: polled, type: test-polled-counter}\n")
            await until(lambda: len(hub.plugins) == 3, 10, what="the reload rebinding the hub")
            assert "epp/endpoint-health" in hub.plugins  # kept across the reload
            assert hub.plugins["test-routed-counter/counter"] is kept  # unchanged: the same instance
            added = hub.plugins["test-polled-counter/polled"]
            assert isinstance(added, PolledCounter)
            warm.peers.set([Peer("new", "127.0.0.1", port)])
            await until(lambda: warm.hub.connected == 1, 5, what="warm hears new")
            added.count("e", 3)
            await until(lambda: polled.learned.get("new") == {"e": 3}, 5, what="the new plugin's deltas sent")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def test_peers_deltas_ride_on_the_ext_proc_reads_of_a_routing_replica() -> None:
    """The app wires the hub's ``ride`` into the h2 server: while the replica routes, peers'
    deltas are read in the wakes its ext_proc reads give the loop (``reads.routing``): ZMQ's, whose
    reads cost a wake of their own (HTTP/2's are read as they arrive)."""
    async with mesh(["warm"]) as (warm,):
        port, grpc = free_port_pair(), free_port()
        app = build_app(new_replica(warm.hub.transport.port, port, grpc_port=grpc, transport="zmq"), {})
        stop = asyncio.Event()
        task = asyncio.create_task(serve(app, stop=stop))
        try:
            await until(lambda: app.serving or task.done(), 20, what="the EPP serving")
            hub = app.sync_hub
            assert hub is not None and not task.done()
            # One loop runs the peer, the EPP and the load here: a wide read gap keeps whether the
            # rides are "steady" (two within a gap) from depending on how loaded the machine is.
            assert isinstance(hub.transport, ZmqTransport)
            hub.transport._gap = 0.2
            sending = asyncio.Event()
            sending.set()

            async def peer_routes() -> None:
                while sending.is_set():
                    warm.counter.count("e1")
                    await asyncio.sleep(0.002)

            peer = asyncio.create_task(peer_routes())
            try:
                vs = xc.variants([f"prompt {i}" for i in range(8)], "m")
                stats = await xc.open_loop("127.0.0.1", grpc, vs, rate=400.0, seconds=1.0)
            finally:
                sending.clear()
                await peer
            assert stats.routed >= 300 and stats.failed == 0
            reads = hub.debug_state()["reads"]
            assert reads["routing"] >= 1, reads
            assert warm.counter.own["e1"] >= 100  # the peer kept sending all along
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


def test_kubernetes_peer_discovery_without_kubernetes_fails_at_build() -> None:
    """k8s-peer-discovery with static endpoints is refused before anything starts, naming the field."""
    config = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {name: peers, type: k8s-peer-discovery, parameters: {service: epp}}
- {type: metrics-data-source}
- {type: core-metrics-extractor}
dataLayer:
  peerDiscovery: {pluginRef: peers}
  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]
"""
    with pytest.raises(
        ConfigError, match=r"dataLayer.peerDiscovery.pluginRef: k8s-peer-discovery needs Kubernetes"
    ):
        build_app(parse_flags([*BASE, f"--config-text={config}"], {}), {})


async def test_debug_state_shows_the_sync_and_a_clean_stop_says_goodbye() -> None:
    """``/debug/plugins/state`` on the metrics port has the hub's state under ``sync``; stopping
    the EPP tells its peer, which forgets it at once (its own liveness timeout is 60 s)."""
    async with mesh(["warm"], kind="h2", timeout=60.0) as (warm,):
        port, metrics = free_port_pair(), free_port()
        opts = new_replica(warm.hub.transport.port, port, metrics_port=metrics)
        app = build_app(opts, {})
        stop = asyncio.Event()
        task = asyncio.create_task(serve(app, stop=stop))
        try:
            await until(lambda: app.serving or task.done(), 20, what="the EPP serving")
            warm.peers.set([Peer("new", "127.0.0.1", port)])
            (counter,) = (p for p in app.components.plugins.values() if isinstance(p, RoutedCounter))
            await until(lambda: warm.hub.connected == 1, 5, what="warm hears new")
            counter.count("e1", 3)
            await until(lambda: warm.counter.learned.get("new") == {"e1": 3}, 5, what="warm learns new")
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{metrics}/debug/plugins/state"

                async def sync_state() -> dict[str, Any]:
                    async with http.get(url) as r:
                        assert r.status == 200
                        body: dict[str, Any] = (await r.json())["sync"]
                        return body

                state = await sync_state()
                assert state["replicaId"] == "new" and state["serving"] and state["restoredFrom"] == "warm"
                assert state["keys"] == ["epp/endpoint-health", "test-routed-counter/counter"]
                assert state["batches"]["sent"] >= 1
                for _ in range(50):  # warm's heartbeats arrive every ~0.1 s
                    if "warm" in (state := await sync_state())["peers"]:
                        break
                    await asyncio.sleep(0.1)
                assert state["peers"]["warm"]["silent"] is False and state["reads"]["messages"] >= 1
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        await until(lambda: "new" not in warm.counter.learned, 5, what="warm forgets new on its goodbye")
        assert warm.hub.stats.goodbyes == 1


S1 = "first-secret-0123456789"
S2 = "second-secret-0123456789"


def test_a_peer_secret_file_is_checked_at_startup_and_watched(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "secret"

    def app_with(*extra: str) -> compose.App:
        return build_app(parse_flags([*BASE, "--peers=127.0.0.1:9100", *extra], {}), {})

    with pytest.raises(ConfigError, match=r"--peer-secret-file .*secret: cannot read"):
        app_with(f"--peer-secret-file={path}")
    path.write_text("# the EPP pods' secret\nshort\n")
    with pytest.raises(ConfigError, match=rf"--peer-secret-file {path}: line 2: .*at least 16 characters"):
        app_with(f"--peer-secret-file={path}")
    path.write_text(f"# the EPP pods' secret\n{S1}\n")
    app = app_with(f"--peer-secret-file={path}")
    assert app.peer_secret is not None and app.peer_secret.presented == S1.encode()
    assert any(w.path == str(path) for w in app.watched)
    assert app_with().peer_secret is None


async def test_replicas_sharing_a_secret_file_warm_start_sync_and_rotate_it_live(
    tmp_path: pathlib.Path,
) -> None:
    """A real EPP with --peer-secret-file takes a peer's snapshot and publishes to it; rewriting
    the file (new secret first) moves what it presents, with no refused call on the way."""
    warm_secret = PeerSecret((S1.encode(),))
    async with mesh(["warm"], kind="h2", secrets=[warm_secret]) as (warm,):
        warm.counter.count("e1", 5)
        path = tmp_path / "secret"
        path.write_text(f"{S1}\n")
        port = free_port_pair()
        opts = new_replica(
            warm.hub.transport.port, port, f"--config-text={CONFIG}", f"--peer-secret-file={path}"
        )
        app = build_app(opts, {})
        stop = asyncio.Event()
        task = asyncio.create_task(serve(app, stop=stop))
        try:
            await until(lambda: app.serving or task.done(), 20, what="the EPP serving")
            assert app.sync_hub is not None and app.sync_hub.restored_from == "warm"
            warm.peers.set([Peer("new", "127.0.0.1", port)])
            (counter,) = (p for p in app.components.plugins.values() if isinstance(p, RoutedCounter))
            await until(lambda: warm.hub.connected == 1, 5, what="warm hears new")
            counter.count("e2", 1)
            await until(lambda: warm.counter.learned.get("new") == {"e2": 1}, 5, what="warm learns new")
            mine = app.sync_hub.transport
            assert isinstance(mine, H2Transport)
            (link,) = mine._links.values()

            async def redialled(step: str) -> None:
                """Each step drops the connections; the link's next client is the re-dialled one."""
                old = link.client
                await until(lambda: link.client not in (None, old) and link.client.connected, 10, what=step)

            warm_secret.set((S1.encode(), S2.encode()))  # step 1 on warm: accept the new secret too
            await redialled("re-dialled after warm's change")
            path.write_text(f"{S2}\n{S1}\n")  # step 2 on new: present it (the file watch applies it)
            await redialled("re-dialled presenting the reloaded file's first secret")
            assert app.peer_secret is not None and app.peer_secret.presented == S2.encode()
            warm_secret.set((S2.encode(),))  # step 3 on warm: drop the old one
            await redialled("re-dialled after warm dropped the old secret")
            counter.count("e2", 1)
            await until(lambda: warm.counter.learned.get("new") == {"e2": 2}, 5, what="still synced")
            transport = warm.hub.transport
            assert isinstance(transport, H2Transport) and transport.unauthenticated == 0
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
