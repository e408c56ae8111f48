"""file-discovery and multicluster-file-discovery: llm-d-router's endpoint file, loaded into a real
datastore, reloaded on change, and wired by the config through the data-layer runtime.

Vectors from llm-d-router's discovery/file plugin_test.go and multicluster_test.go at ebab68792.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.discovery.file import (
    FileDiscovery,
    FileDiscoveryParams,
    MultiClusterFileDiscovery,
)
from epp.datalayer.runtime import DataLayerRuntime
from epp.datastore.store import Datastore
from epp.errors import ConfigError
from epp.testing.plugins import FakeHandle
from epp.testing.waiting import until

VALID = """
endpoints:
  - name: ep1
    namespace: ns1
    address: "10.0.0.1"
    port: "8000"
  - name: ep2
    address: "10.0.0.2"
    port: "8001"
"""


def _discovery(path: Path, *, watch: bool = False, multicluster: bool = False) -> FileDiscovery:
    cls = MultiClusterFileDiscovery if multicluster else FileDiscovery
    params = FileDiscoveryParams.model_validate({"path": str(path), "watchFile": watch})
    return cls(cls.TYPE, params, FakeHandle())


def _names(ds: Datastore) -> set[str]:
    return {ep.name for ep in ds.endpoints()}


def test_path_is_required() -> None:
    with pytest.raises(ValidationError, match="path"):
        FileDiscoveryParams.model_validate({"watchFile": True})


async def test_loads_endpoints_with_namespaces(tmp_path: Path) -> None:
    """Upstream's TestStart_LoadsEndpoints / DefaultNamespace / MetricsHostIsAddressPort."""
    path = tmp_path / "endpoints.yaml"
    path.write_text(VALID)
    ds = Datastore()
    fd = _discovery(path)
    await fd.start_discovery(ds)
    assert _names(ds) == {"ns1/ep1", "default/ep2"}
    ep1 = ds.get("ns1/ep1")
    assert ep1 is not None
    assert (ep1.metadata.namespace, ep1.metadata.pod_name, ep1.metadata.metrics_host) == (
        "ns1",
        "ep1",
        "10.0.0.1:8000",
    )
    ep2 = ds.get("default/ep2")
    assert ep2 is not None and ep2.metadata.hostport == "10.0.0.2:8001"
    await fd.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            'endpoints:\n- {name: ep1, address: "not-an-ip", port: "8000"}\n',
            "invalid IPv4 address",
            id="invalid-ip",
        ),
        pytest.param(
            'endpoints:\n- {name: ep1, address: "::1", port: "8000"}\n', "invalid IPv4 address", id="ipv6"
        ),
        pytest.param(
            'endpoints:\n- {name: ep1, address: "10.0.0.1", port: "99999"}\n',
            r"endpoints\[0\]\.port",
            id="invalid-port",
        ),
        pytest.param("x" * ((1 << 20) + 1), "exceeds 1 MiB limit", id="too-large"),
        pytest.param("endpoints: [\n", "invalid YAML", id="not-yaml"),
    ],
)
async def test_initial_load_problems_fail_startup(tmp_path: Path, text: str, message: str) -> None:
    """As upstream's Start: any bad entry or file-level problem fails the initial load."""
    path = tmp_path / "endpoints.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"initial load failed: .*{message}"):
        await _discovery(path).start_discovery(Datastore())


async def test_missing_file_fails_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"file-discovery: initial load failed: .*cannot read"):
        await _discovery(tmp_path / "nonexistent.yaml").start_discovery(Datastore())


async def test_watch_reloads_adds_and_removes(tmp_path: Path) -> None:
    """Upstream's TestStart_WatchFileReloadsOnWrite and DeletesRemovedEndpoints: a new version
    is applied, endpoints it no longer lists are removed; a bad entry in it is skipped."""
    path = tmp_path / "endpoints.yaml"
    path.write_text(VALID)
    ds = Datastore()
    fd = _discovery(path, watch=True)
    await fd.start_discovery(ds)
    try:
        path.write_text(
            'endpoints:\n- {name: ep1, namespace: ns1, address: "10.0.0.1", port: "8000"}\n'
            '- {name: ep3, address: "10.0.0.3", port: "9000"}\n'
            '- {name: bad, address: "gw.example.com", port: "9000"}\n'
        )
        await until(lambda: _names(ds) == {"ns1/ep1", "default/ep3"}, what="the reloaded endpoint set")
        assert len(fd.skipped) == 1 and "invalid IPv4 address" in fd.skipped[0]
        path.write_text("endpoints: [\n")  # a broken version keeps the last good set
        await until(
            lambda: fd.debug_state()["path"] == str(path) and _broken_seen(fd), what="the broken version"
        )
        assert _names(ds) == {"ns1/ep1", "default/ep3"}
    finally:
        await fd.stop()


def _broken_seen(fd: FileDiscovery) -> bool:
    watched = fd._watched
    return watched is not None and watched.failures > 0


async def test_without_watch_the_file_is_read_once(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(VALID)
    fd = _discovery(path)
    ds = Datastore()
    await fd.start_discovery(ds)
    assert fd._watched is not None and fd._watched._task is None  # no watcher task
    await fd.stop()


# --- multicluster-file-discovery --------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("10.0.0.1", True),
        ("::1", True),
        ("gw.cluster-a.example.com", True),
        ("gateway", True),
        ("gw.example.com.", False),
        ("GW.example.com", False),
        ("3com.example.com", True),
        ("", False),
        ("gw_1.example.com", False),
        ("12345", True),
        ("gw:443", False),
        ("gw\x00.example.com", False),
        ("user@host", False),
        ("-bad.example.com", False),
        ("gw..example.com", False),
    ],
)
def test_multicluster_accepts_hosts_or_ips(tmp_path: Path, address: str, ok: bool) -> None:
    """Upstream's TestValidateHostOrIP vectors."""
    assert (_discovery(tmp_path / "f", multicluster=True).check_address(address) == "") is ok


@pytest.mark.parametrize(
    ("address", "ok"), [("10.0.0.1", True), ("gw.example.com", False), ("::1", False), ("", False)]
)
def test_stock_takes_ipv4_only(tmp_path: Path, address: str, ok: bool) -> None:
    """Upstream's TestValidateIPv4Address vectors."""
    assert (_discovery(tmp_path / "f").check_address(address) == "") is ok


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        pytest.param({"metricsAddress": "10.0.0.11", "metricsPort": "9090"}, "10.0.0.11:9090", id="both"),
        pytest.param({"metricsAddress": "10.0.0.11"}, "10.0.0.11:8080", id="address-alone"),
        pytest.param({"metricsPort": "9090"}, "10.0.0.12:8080", id="port-alone-ignored"),
        pytest.param({}, "10.0.0.12:8080", id="no-labels"),
        pytest.param(
            {"metricsAddress": "gw.example.com", "metricsPort": "443"}, "gw.example.com:443", id="hostname"
        ),
    ],
)
async def test_multicluster_metrics_host_from_labels(
    tmp_path: Path, labels: dict[str, str], want: str
) -> None:
    """Upstream's TestMetricsHostFromLabels vectors, through a loaded file."""
    path = tmp_path / "clusters.yaml"
    entry: dict[str, Any] = {"name": "split", "address": "10.0.0.12", "port": "8080", "labels": labels}
    path.write_text(yaml.safe_dump({"endpoints": [entry]}))
    ds = Datastore()
    await _discovery(path, multicluster=True).start_discovery(ds)
    (ep,) = ds.endpoints()
    assert ep.metadata.metrics_host == want
    assert ep.metadata.hostport == "10.0.0.12:8080"


async def test_multicluster_keeps_host_names(tmp_path: Path) -> None:
    """Upstream's TestMultiClusterFactory_AcceptsHostname; the stock plugin refuses the same file."""
    path = tmp_path / "clusters.yaml"
    path.write_text('endpoints:\n- {name: cluster-a, address: gw.cluster-a.example.com, port: "443"}\n')
    ds = Datastore()
    await _discovery(path, multicluster=True).start_discovery(ds)
    (ep,) = ds.endpoints()
    assert (ep.name, ep.metadata.address) == ("default/cluster-a", "gw.cluster-a.example.com")
    with pytest.raises(ConfigError, match="invalid IPv4 address"):
        await _discovery(path).start_discovery(Datastore())


# --- wired by the config ------------------------------------------------------------------

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  name: file-discovery
  parameters:
    path: {path}
    watchFile: true
- type: queue-scorer
- type: max-score-picker
- type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: file-discovery
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


async def test_config_discovery_fills_the_datastore_and_the_endpoints_are_scraped(
    tmp_path: Path, servers: Callable[[int], Any]
) -> None:
    """dataLayer.discovery: the runtime starts the plugin with the datastore; what it finds is
    scraped by the default metrics source; a removed entry leaves the datastore."""
    (srv,) = await servers(1)
    path = tmp_path / "endpoints.yaml"
    path.write_text(f'endpoints:\n- {{name: vllm-0, address: "127.0.0.1", port: "{srv.port}"}}\n')
    components = build(
        load_config(CONFIG.format(path=path)), default_registry(entry_points=False), BuildOptions()
    )
    ds = Datastore()
    async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
        ep = ds.get("default/vllm-0")
        assert ep is not None
        await until(lambda: ep.metrics.update_time > 0, what="a scrape of the discovered endpoint")
        assert ep.metrics.waiting_queue_size == 3
        path.write_text("endpoints: []\n")
        await until(lambda: not ds.endpoints(), what="the endpoint's removal")


def test_config_discovery_must_name_a_discovery_plugin() -> None:
    text = CONFIG.format(path="/x").replace("pluginRef: file-discovery", "pluginRef: queue-scorer")
    with pytest.raises(
        ConfigError,
        match=r"dataLayer\.discovery\.pluginRef: the plugin queue-scorer is not an endpoint discovery",
    ):
        build(load_config(text), default_registry(entry_points=False), BuildOptions())
