"""/debug/plugins/state as the running EPP composes it (``app.debug.debug_state``): the live
plugins, detector verdicts and flow-control queues, also after a config reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from epp.app.compose import App, build_app
from epp.app.debug import debug_state
from epp.app.reload import SUCCESS, ConfigReloader
from epp.cli.flags import parse_flags
from epp.metrics.exporter import MetricsServer
from epp.testing.builders import make_endpoint

BODY = b'{"model": "m", "prompt": "%s"}' % (b"hello there, " * 100)
HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
# The utilization detector by name, with a staleness threshold a loaded test machine cannot hit.
BASE = (
    HEAD
    + """plugins:
- type: queue-scorer
- type: utilization-detector
  parameters:
    metricsStalenessThreshold: 1h
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""
)
# Adds a DebugState plugin, switches the detector and turns flow control on.
PREFIX_AND_FLOW_CONTROL = (
    HEAD
    + """featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: concurrency-detector
saturationDetector:
  pluginRef: concurrency-detector
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: prefix-cache-scorer
"""
)


def _app(tmp_path: Path) -> App:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    flags = [
        f"--config-file={path}",
        "--endpoints=127.0.0.1:8000,127.0.0.1:8001",
        "--config-reload-interval=0",
    ]
    app = build_app(parse_flags(flags, {}), {})
    for i, ep in enumerate(app.datastore.endpoints()):
        ep.metrics = make_endpoint(i, queue=10).metrics  # twice the default queue threshold
    return app


async def _get(http: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    async with http.get(f"http://127.0.0.1:{port}/debug/plugins/state") as r:
        assert r.status == 200
        body: dict[str, Any] = await r.json()
        return body


async def test_the_endpoint_shows_the_plugins_and_queues_of_the_config_serving_now(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with (
        ConfigReloader(app) as reloader,
        MetricsServer("127.0.0.1", 0, enable_pprof=False, debug_state=lambda: debug_state(app, None)) as srv,
        aiohttp.ClientSession() as http,
    ):
        state = await _get(http, srv.port)
        assert "approx-prefix-cache-producer" not in state["plugins"]
        assert state["flowControl"] is None  # legacy admission: no queues
        assert state["saturation"]["detector"] == "utilization-detector"
        utilization = state["saturation"]["detectors"]["utilization-detector"]
        assert (utilization["saturation"], utilization["saturated"]) == (2.0, True)

        assert await reloader.reload(PREFIX_AND_FLOW_CONTROL.encode()) == SUCCESS
        state = await _get(http, srv.port)
        assert state["plugins"]["approx-prefix-cache-producer"]["hitRate"]["requests"] == 0
        assert state["flowControl"]["running"] is True
        assert state["flowControl"]["queued"] == 0
        assert state["saturation"]["detector"] == "concurrency-detector"
        assert set(state["saturation"]["detectors"]) == {"concurrency-detector"}
        assert (
            state["saturation"]["detectors"]["concurrency-detector"]["saturated"] is False
        )  # none in flight

        assert await reloader.reload(BASE.encode()) == SUCCESS
        state = await _get(http, srv.port)
        assert "approx-prefix-cache-producer" not in state["plugins"]
        assert state["flowControl"] is None
        assert state["saturation"]["detector"] == "utilization-detector"
