"""Live config reload: state kept for unchanged plugins, in-flight requests on their pipeline,
rejection keeps the old config, SIGHUP, partial writes, flow control and the data layer."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from itertools import chain
from pathlib import Path
from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

from epp.app.build import BuildOptions, build
from epp.app.compose import App
from epp.app.options import Options
from epp.app.reload import FAILURE, SUCCESS, UNCHANGED, ConfigReloader
from epp.config.load import load_config
from epp.datalayer.builtin import BUILTINS as DATALAYER_BUILTINS
from epp.datastore.store import Datastore, PoolInfo
from epp.director.builtin import BUILTINS as DIRECTOR_BUILTINS
from epp.director.director import Director
from epp.director.lifecycle import RequestLifecycle
from epp.flowcontrol.builtin import BUILTINS as FLOWCONTROL_BUILTINS
from epp.metrics.llmd import FamilySetView
from epp.metrics.series import REGISTRY
from epp.parsers.builtin import BUILTINS as PARSERS_BUILTINS
from epp.plugin.base import PluginBase, PluginParams
from epp.plugin.registry import Registry
from epp.scheduling.api import ScorerCategory
from epp.scheduling.builtin import BUILTINS as SCHEDULING_BUILTINS
from epp.testing import waiting
from epp.testing.builders import make_endpoint
from epp.tracing.otel import setup_tracing

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
BODY = b'{"model": "m", "prompt": "%s"}' % (b"hello there, " * 100)
# pod-0 has the short queue, pod-1 the empty KV cache: each scorer alone picks a different one.
POD0, POD1 = "192.168.1.1:8000", "192.168.1.2:8000"


def config(scorer: str = "queue-scorer", *, extra: str = "", prefix_params: str = "") -> str:
    return (
        HEAD
        + f"""plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: approx-prefix-cache-producer
{prefix_params}- type: prefix-cache-scorer
{extra}schedulingProfiles:
- name: default
  plugins:
  - pluginRef: {scorer}
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 0.01
"""
    )


class Params(PluginParams):
    tag: str = ""


class LifecycleScorer(PluginBase):
    """A scorer with a background lifecycle, to see when a reload starts and stops it."""

    TYPE: ClassVar[str] = "test-lifecycle-scorer"
    PARAMS: ClassVar[type[PluginParams]] = Params
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE
    running: ClassVar[set[int]] = set()

    async def start(self) -> None:
        LifecycleScorer.running.add(id(self))

    async def stop(self) -> None:
        LifecycleScorer.running.discard(id(self))

    def score(self, state: Any, request: Any, endpoints: Any) -> list[float]:
        return [0.0] * len(endpoints)


def registry() -> Registry:
    return Registry(
        chain(
            SCHEDULING_BUILTINS,
            DIRECTOR_BUILTINS,
            PARSERS_BUILTINS,
            DATALAYER_BUILTINS,
            FLOWCONTROL_BUILTINS,
            [LifecycleScorer],
        )
    )


def options(**flags: Any) -> Options:
    """The command line's Options; tests drive the watcher (or SIGHUP) themselves unless they say."""
    return Options(**{"config_reload_interval": 0.0, **flags})


def make_app(path: Path, text: str, reg: Registry) -> App:
    path.write_text(text)
    components = build(load_config(text), reg, BuildOptions())
    ds = Datastore()
    ds.pool = PoolInfo(name="pool", namespace="default", app_protocol="http")
    ds.replace_all([make_endpoint(0).metadata, make_endpoint(1).metadata])
    pod0, pod1 = ds.endpoints()
    pod0.metrics = make_endpoint(0, queue=0, kv=0.9).metrics
    pod1.metrics = make_endpoint(1, queue=10, kv=0.0).metrics
    admission = components.admission.controller(ds)
    pipeline = components.request_control.pipeline(
        scheduler=components.scheduler, admission=admission, staleness_threshold=0.0
    )
    return App(
        options=options(config_file=str(path)),
        components=components,
        director=Director(ds, pipeline),
        datastore=ds,
        data_layer=components.data_layer.runtime(ds, refresh_interval=60.0),
        admission=admission,
        tracing=setup_tracing(Options(tracing=False), {}, install_global=False),
    )


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[tuple[App, ConfigReloader]]:
    reg = registry()
    app = make_app(tmp_path / "config.yaml", config(), reg)
    for plugin in app.components.lifecycle:
        await plugin.start()
    async with app.data_layer, ConfigReloader(app, registry=reg) as reloader:
        yield app, reloader
    for plugin in app.components.lifecycle:
        await plugin.stop()


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


def reloads(result: str) -> float:
    return REGISTRY.get_sample_value("inference_extension_config_reload_total", {"result": result}) or 0.0


async def route(app: App, request_id: str = "r") -> tuple[RequestLifecycle, str]:
    lc = app.director.start({"x-request-id": request_id}, {})
    decision = await lc.route(BODY)
    return lc, decision.destination


async def test_a_new_weight_changes_routing_and_keeps_unchanged_plugins(
    live: tuple[App, ConfigReloader], tmp_path: Path
) -> None:
    app, reloader = live
    lc, dest = await route(app)
    lc.close()
    assert dest == POD0  # the queue scorer
    before = dict(app.components.plugins)
    old_pipeline = app.director.pipeline
    successes = reloads(SUCCESS)

    assert await reloader.reload(config("kv-cache-utilization-scorer").encode()) == SUCCESS

    lc, dest = await route(app)
    lc.close()
    assert dest == POD1  # the KV-cache scorer now
    assert app.director.pipeline is not old_pipeline
    for name, plugin in app.components.plugins.items():
        assert plugin is before[name], name  # no plugin's type or parameters changed
    assert reloads(SUCCESS) == successes + 1
    assert reloader.generation == 2


async def test_changed_parameters_build_a_new_instance(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    producer = app.components.plugins["approx-prefix-cache-producer"]
    scorer = app.components.plugins["queue-scorer"]
    text = config(prefix_params="  parameters:\n    blockSizeTokens: 32\n")

    assert await reloader.reload(text.encode()) == SUCCESS

    fresh = app.components.plugins["approx-prefix-cache-producer"]
    assert fresh is not producer
    assert app.components.plugins["queue-scorer"] is scorer
    assert app.components.reused == frozenset(app.components.plugins) - {"approx-prefix-cache-producer"}
    # the producer watches the datastore (it forgets removed endpoints): the new one replaces it
    await waiting.until(lambda: reloader.retiring == 0, what="old config retired")
    observers: list[object] = list(app.datastore._observers)
    assert fresh in observers
    assert producer not in observers


async def test_a_plugin_that_looks_others_up_through_the_handle_is_rebuilt(tmp_path: Path) -> None:
    reg = registry()
    detector = "- type: concurrency-detector\n"
    tail = "saturationDetector:\n  pluginRef: concurrency-detector\n"
    app = make_app(tmp_path / "config.yaml", config(extra=detector) + tail, reg)
    before = dict(app.components.plugins)
    async with ConfigReloader(app, registry=reg) as reloader:
        text = config("kv-cache-utilization-scorer", extra=detector) + tail
        assert await reloader.reload(text.encode()) == SUCCESS
    after = app.components.plugins
    assert after["concurrency-detector"] is not before["concurrency-detector"]
    assert app.components.saturation_detector is after["concurrency-detector"]
    assert all(after[name] is before[name] for name in after if name != "concurrency-detector")


async def test_the_prefix_index_survives_a_reload(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    for i in range(3):
        lc, _ = await route(app, f"warm-{i}")
        lc.close()
    producer = app.components.plugins["approx-prefix-cache-producer"]
    state = producer.debug_state()  # type: ignore[attr-defined]
    assert state["entries"] > 0

    assert await reloader.reload(config("kv-cache-utilization-scorer").encode()) == SUCCESS

    assert app.components.plugins["approx-prefix-cache-producer"] is producer
    assert producer.debug_state() == state  # type: ignore[attr-defined]


async def test_a_request_in_flight_finishes_on_the_pipeline_it_started_with(
    live: tuple[App, ConfigReloader],
) -> None:
    app, reloader = live
    early = app.director.start({"x-request-id": "early"}, {})  # headers in, body not yet

    assert await reloader.reload(config("kv-cache-utilization-scorer").encode()) == SUCCESS

    late = app.director.start({"x-request-id": "late"}, {})
    assert (await early.route(BODY)).destination == POD0  # the old config's scorer
    assert (await late.route(BODY)).destination == POD1
    early.close()
    late.close()


async def test_plugins_the_new_config_drops_stop_once_their_requests_finish(tmp_path: Path) -> None:
    reg = registry()
    lifecycle = "- type: test-lifecycle-scorer\n  parameters: {tag: a}\n"
    app = make_app(tmp_path / "config.yaml", config(extra=lifecycle), reg)
    (old,) = app.components.lifecycle
    await old.start()
    async with ConfigReloader(app, registry=reg) as reloader:
        in_flight = app.director.start({"x-request-id": "slow"}, {})
        await in_flight.route(BODY)

        # the plugin's parameters change: a new instance starts, the old one waits for "slow"
        assert await reloader.reload(config(extra=lifecycle.replace("tag: a", "tag: b")).encode()) == SUCCESS
        (new,) = app.components.lifecycle
        assert new is not old
        assert id(new) in LifecycleScorer.running
        await asyncio.sleep(0)  # the retiring task runs, and must keep waiting
        assert id(old) in LifecycleScorer.running
        assert reloader.retiring == 1

        in_flight.close()
        await waiting.until(lambda: id(old) not in LifecycleScorer.running, what="old plugin stopped")
    assert id(new) not in LifecycleScorer.running  # the reloader stops what it started


async def test_an_invalid_config_is_rejected_with_its_field_path_and_the_old_one_serves(
    live: tuple[App, ConfigReloader],
) -> None:
    app, reloader = live
    pipeline, components = app.director.pipeline, app.components
    failures = reloads(FAILURE)
    bad = config().replace("weight: 1", "weight: -1")

    with capture_logs() as logs:
        assert await reloader.reload(bad.encode()) == FAILURE

    assert app.director.pipeline is pipeline
    assert app.components is components
    assert reloads(FAILURE) == failures + 1
    assert REGISTRY.get_sample_value("inference_extension_config_last_reload_successful") == 0
    (event,) = [e for e in logs if e["event"] == "config_reload_failed"]
    assert "schedulingProfiles[0].plugins[0].weight" in event["error"]
    assert event["error"].startswith(reloader.path)
    lc, dest = await route(app)
    lc.close()
    assert dest == POD0
    assert await reloader.reload(config().encode()) == UNCHANGED  # the file is fixed back
    assert REGISTRY.get_sample_value("inference_extension_config_last_reload_successful") == 1


async def test_a_config_that_fails_to_build_is_rejected(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    pipeline = app.director.pipeline
    bad = config().replace("pluginRef: prefix-cache-scorer", "pluginRef: no-such-plugin")
    with capture_logs() as logs:
        assert await reloader.reload(bad.encode()) == FAILURE
    assert app.director.pipeline is pipeline
    (event,) = [e for e in logs if e["event"] == "config_reload_failed"]
    assert "schedulingProfiles[0].plugins[1]" in event["error"]
    assert "no-such-plugin" in event["error"]


async def test_the_same_config_reformatted_is_unchanged(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    pipeline = app.director.pipeline
    unchanged = reloads(UNCHANGED)
    assert await reloader.reload(("# a comment\n" + config()).encode()) == UNCHANGED
    assert app.director.pipeline is pipeline
    assert reloads(UNCHANGED) == unchanged + 1
    assert reloader.generation == 1


async def test_llmd_configs_reload_too(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    text = config("kv-cache-utilization-scorer").replace(
        "inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1"
    )
    assert await reloader.reload(text.encode()) == SUCCESS
    lc, dest = await route(app)
    lc.close()
    assert dest == POD1


async def test_a_parser_the_pool_cannot_use_is_rejected(live: tuple[App, ConfigReloader]) -> None:
    _app, reloader = live  # the pool speaks http
    grpc = config(extra="- type: vllmgrpc-parser\n") + "parser:\n  pluginRef: vllmgrpc-parser\n"
    with capture_logs() as logs:
        assert await reloader.reload(grpc.encode()) == FAILURE
    (event,) = [e for e in logs if e["event"] == "config_reload_failed"]
    assert "parser.pluginRef" in event["error"]


async def test_a_file_changed_between_startup_and_watching_is_applied(tmp_path: Path) -> None:
    reg = registry()
    app = make_app(tmp_path / "config.yaml", config(), reg)
    write(str(tmp_path / "config.yaml"), config("kv-cache-utilization-scorer"))  # after startup read it
    app.options = options(config_file=str(tmp_path / "config.yaml"), config_reload_interval=0.01)
    async with ConfigReloader(app, registry=reg) as reloader:
        await waiting.until(lambda: reloader.generation == 2, what="the newer file applied")
    lc, dest = await route(app)
    lc.close()
    assert dest == POD1


async def test_sighup_rereads_the_file(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live  # polling is off (interval 0): only the signal can make it re-read
    write(reloader.path, config("kv-cache-utilization-scorer"))
    os.kill(os.getpid(), signal.SIGHUP)
    await waiting.until(lambda: reloader.generation == 2, what="reload on SIGHUP")
    lc, dest = await route(app)
    lc.close()
    assert dest == POD1


async def test_sighup_without_a_file_says_why(tmp_path: Path) -> None:
    reg = registry()
    app = make_app(tmp_path / "config.yaml", config(), reg)
    app.options = options(config_text=config())
    with capture_logs() as logs:
        async with ConfigReloader(app, registry=reg):
            os.kill(os.getpid(), signal.SIGHUP)
            await waiting.until(lambda: len(logs) >= 2, what="SIGHUP logged")
    events = [(e["event"], e.get("signal")) for e in logs]
    assert events == [("config_reload_unavailable", None), ("config_reload_unavailable", "SIGHUP")]
    assert "--config-text" in logs[0]["reason"]


async def test_a_partial_write_is_rejected_then_the_whole_file_applies(
    live: tuple[App, ConfigReloader],
) -> None:
    _app, reloader = live
    watcher = reloader.watcher
    assert watcher is not None
    whole = config("kv-cache-utilization-scorer")
    failures = reloads(FAILURE)
    write(reloader.path, whole[: whole.index("weight: 1")] + "weight: [")  # a writer stopped half-way
    assert not await watcher.check()  # debounce: seen once
    assert await watcher.check()  # seen twice: handed over, rejected
    assert reloads(FAILURE) == failures + 1
    assert reloader.generation == 1
    write(reloader.path, whole)
    assert not await watcher.check()
    assert await watcher.check()
    assert reloader.generation == 2
    assert reloads(FAILURE) == failures + 1


async def test_flow_control_queues_survive_an_unrelated_change(tmp_path: Path) -> None:
    reg = registry()
    gate = "featureGates: [flowControl]\n"
    app = make_app(tmp_path / "config.yaml", config().replace(HEAD, HEAD + gate), reg)
    async with app.admission, ConfigReloader(app, registry=reg) as reloader:  # type: ignore[attr-defined]
        admission = app.admission
        text = config("kv-cache-utilization-scorer").replace(HEAD, HEAD + gate)
        assert await reloader.reload(text.encode()) == SUCCESS
        assert app.admission is admission
        assert app.director.pipeline.admission is admission

        bounded = text + "flowControl:\n  maxRequests: 100\n"
        assert await reloader.reload(bounded.encode()) == SUCCESS
        assert app.admission is not admission
        assert app.director.pipeline.admission is app.admission
        await waiting.until(lambda: reloader.retiring == 0, what="old flow controller retired")


async def test_a_queued_request_survives_a_reload_and_is_dispatched(tmp_path: Path) -> None:
    reg = registry()
    gate = "featureGates: [flowControl]\n"
    app = make_app(tmp_path / "config.yaml", config().replace(HEAD, HEAD + gate), reg)
    async with app.admission, ConfigReloader(app, registry=reg) as reloader:  # type: ignore[attr-defined]
        controller = app.admission.controller  # type: ignore[attr-defined]
        queued = app.director.start({"x-request-id": "queued"}, {})
        routing = asyncio.create_task(queued.route(BODY))  # both pods are saturated: it waits
        await waiting.until(lambda: controller.queued == 1, what="request queued")

        text = config("kv-cache-utilization-scorer").replace(HEAD, HEAD + gate)
        assert await reloader.reload(text.encode()) == SUCCESS
        assert app.admission.controller is controller  # type: ignore[attr-defined]
        assert controller.queued == 1

        pod0, pod1 = app.datastore.endpoints()
        pod0.metrics = make_endpoint(0, queue=0, kv=0.1).metrics  # capacity frees up
        pod1.metrics = make_endpoint(1, queue=3, kv=0.0).metrics
        app.admission.notify()
        decision = await routing
        assert decision.destination == POD0  # dispatched, and routed by the queue scorer it started with
        queued.close()


async def test_the_data_layer_is_kept_unless_its_section_changes(live: tuple[App, ConfigReloader]) -> None:
    app, reloader = live
    runtime = app.data_layer
    assert await reloader.reload(config("kv-cache-utilization-scorer").encode()) == SUCCESS
    assert app.data_layer is runtime

    section = (
        "- type: metrics-data-source\n  parameters: {path: /other-metrics}\n- type: core-metrics-extractor\n"
    )
    wiring = (
        "dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n"
        "    extractors:\n    - pluginRef: core-metrics-extractor\n"
    )
    assert await reloader.reload((config(extra=section) + wiring).encode()) == SUCCESS
    assert app.data_layer is not runtime
    assert app.data_layer.active_loops == len(app.datastore.endpoints())


async def test_metrics_name_the_config_and_have_llmd_twins(live: tuple[App, ConfigReloader]) -> None:
    _app, reloader = live
    first = reloader.digest
    assert REGISTRY.get_sample_value("inference_extension_config_generation", {"hash": first}) == 1
    assert await reloader.reload(config("kv-cache-utilization-scorer").encode()) == SUCCESS
    exposed = FamilySetView(REGISTRY)
    assert exposed.get_sample_value("inference_extension_config_generation", {"hash": first}) is None
    assert exposed.get_sample_value("llm_d_epp_config_generation", {"hash": reloader.digest}) == 2
    total = exposed.get_sample_value("llm_d_epp_config_reload_total", {"result": "success"})
    assert total == reloads(SUCCESS) > 0
