"""Put a built config in place: start what is new, swap the pipeline, retire what is unused.

``ConfigSwap.swap`` is the on-the-event-loop half of a live reload (``reload.py`` is the
other: when, and the build in a worker thread).  Given the serving app and the new
``Components`` (whose unchanged plugins are the serving instances):

* new plugins with a lifecycle are started;
* flow control (its queues) is kept when its settings, detector and policies are the same
  objects, else a new controller starts;
* the data layer (its poll loops) is kept when its bindings are the same plugins, else a new
  runtime takes over;
* ``Director.swap`` makes the new pipeline the one new requests start on, in one
  assignment; requests in flight finish on the pipeline they started with;
* what the new config no longer uses (plugins with a lifecycle, a replaced flow controller,
  datastore observers) is stopped once no request uses the old pipeline any more.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

import structlog

from epp.admission.api import AdmissionController
from epp.admission.assembly import AdmissionPlan
from epp.app.build import Components
from epp.app.compose import App
from epp.datalayer.runtime import DataLayerRuntime
from epp.director.director import Director
from epp.health.shared import EXCHANGE
from epp.plugin.base import Lifecycle

log = structlog.get_logger(__name__)

DRAIN_LIMIT: Final = 600.0  # seconds a replaced pipeline may stay in use before its plugins stop anyway
DRAIN_POLL: Final = 0.05


@dataclass(slots=True)
class _Retiring:
    """What the previous config used and the new one does not; stopped once ``director`` drains."""

    director: Director
    plugins: tuple[Lifecycle, ...]
    admission: AdmissionController | None
    observers: tuple[Any, ...]


class ConfigSwap:
    """Swaps configs into ``app`` and retires the old ones; ``close`` stops what it started."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._retiring: set[asyncio.Task[None]] = set()
        self._original: tuple[Components, DataLayerRuntime, AdmissionController] = (
            app.components,
            app.data_layer,
            app.admission,
        )

    @property
    def retiring(self) -> int:
        """Replaced pipelines whose plugins still wait for their requests to finish."""
        return len(self._retiring)

    async def close(self) -> None:
        """Stop retiring at once, and what swaps started; the startup set is the caller's to stop."""
        for task in tuple(self._retiring):
            task.cancel()  # its finally-block stops what it retires, without waiting
        await asyncio.gather(*self._retiring, return_exceptions=True)
        components, data_layer, admission = self._original
        app = self.app
        original = {id(p) for p in components.lifecycle}
        for plugin in reversed(app.components.lifecycle):
            if id(plugin) not in original:
                await _stop(plugin)
        if app.admission is not admission:
            await _exit(app.admission)
        if app.data_layer is not data_layer:
            await _exit(app.data_layer)

    async def swap(self, new: Components) -> None:
        """Start what is new, swap the pipeline, retire what is no longer used (see the module doc).

        Raises (after stopping what it started) if a new part fails to start; nothing is
        swapped then."""
        app = self.app
        old = app.components
        ds = app.datastore
        old_lifecycle = {id(p) for p in old.lifecycle}
        new_lifecycle = {id(p) for p in new.lifecycle}
        started: list[Lifecycle] = []
        admission = app.admission
        data_layer = app.data_layer
        try:
            for plugin in new.lifecycle:
                if id(plugin) not in old_lifecycle:
                    await plugin.start()
                    started.append(plugin)
            if not _same_admission(old.admission, new.admission):
                admission = new.admission.controller(ds)
                if hasattr(admission, "__aenter__"):
                    await admission.__aenter__()
            if new.data_layer.bindings != old.data_layer.bindings:
                data_layer = await self._new_data_layer(new, data_layer)
        except BaseException:
            for plugin in reversed(started):
                await _stop(plugin)
            if admission is not app.admission:
                await _exit(admission)
            raise
        old_observers = {id(o) for o in old.observers}
        for observer in new.observers:
            if id(observer) not in old_observers:
                ds.add_observer(observer)
        _restart_only(old, new, data_layer, app)
        director = app.director
        previous = director.current
        p = previous.pipeline
        director.swap(
            new.request_control.pipeline(
                scheduler=new.scheduler,
                admission=admission,
                producer_timeout=p.producer_timeout,
                subset_filter=p.subset_filter,
                emit_endpoint_scores=p.emit_endpoint_scores,
                explain_header=p.explain_header,
                decisions=p.decisions,  # the same ring: /debug/decisions keeps its history
                staleness_threshold=p.staleness_threshold,
            )
        )
        replaced_admission = app.admission if admission is not app.admission else None
        app.components, app.admission, app.data_layer = new, admission, data_layer
        if app.sync_hub is not None:  # share the new instances' state (surviving keys keep their view)
            app.sync_hub.bind([*new.plugins.values(), EXCHANGE])  # and the pod's shared ejections
        new_observers = {id(o) for o in new.observers}
        retiring = _Retiring(
            director=previous,
            plugins=tuple(p for p in old.lifecycle if id(p) not in new_lifecycle),
            admission=replaced_admission,
            observers=tuple(o for o in old.observers if id(o) not in new_observers),
        )
        if retiring.plugins or retiring.admission is not None or retiring.observers:
            task = asyncio.get_running_loop().create_task(self._retire(retiring), name="config-retire")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _new_data_layer(self, new: Components, old: DataLayerRuntime) -> DataLayerRuntime:
        """A runtime for the new bindings, entered; the old one is left (exited) when it returns.

        A source both configs bind is started and stopped by whichever runtime owns it, and
        binding re-wires its extractors: so with a shared source the old runtime stops first
        (a poll gap of a few milliseconds; endpoint metrics stay in the datastore).
        """
        interval = old.refresh_interval
        shared = {id(b.source) for b in new.data_layer.bindings} & {
            id(b.source) for b in self.app.components.data_layer.bindings
        }
        if not shared:
            runtime = new.data_layer.runtime(self.app.datastore, refresh_interval=interval)
            await runtime.__aenter__()
            await _exit(old)
            return runtime
        await _exit(old)
        try:
            runtime = new.data_layer.runtime(self.app.datastore, refresh_interval=interval)
            await runtime.__aenter__()
        except BaseException:  # put the old bindings back to work
            back = self.app.components.data_layer.runtime(self.app.datastore, refresh_interval=interval)
            await back.__aenter__()
            self.app.data_layer = back
            raise
        return runtime

    async def _retire(self, retiring: _Retiring) -> None:
        """Once no request runs on the replaced pipeline, stop what only it used."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_LIMIT
        try:
            # Polled: a per-request event to wait on would cost every request, not a reload.
            while retiring.director.in_flight > 0 and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(DRAIN_POLL)
            if retiring.director.in_flight > 0:
                log.warning("config_retire_timeout", in_flight=retiring.director.in_flight)
        finally:
            for observer in retiring.observers:
                self.app.datastore.remove_observer(observer)
            for plugin in reversed(retiring.plugins):
                await _stop(plugin)
            if retiring.admission is not None:
                await _exit(retiring.admission)
            log.info(
                "config_retired",
                plugins=[str(getattr(p, "typed_name", p)) for p in retiring.plugins],
                admission=retiring.admission is not None,
            )


def _same_admission(old: AdmissionPlan, new: AdmissionPlan) -> bool:
    """Whether the running admission controller serves the new plan as it is (queues kept)."""
    if old.detector is not new.detector:
        return False
    if old.flow_control is None or new.flow_control is None:
        return old.flow_control is None and new.flow_control is None
    o, n = old.flow_control, new.flow_control
    if o.settings != n.settings:
        return False
    return all(o.plugins.get(ref) is n.plugins.get(ref) for ref in _policy_refs(n.settings))


def _policy_refs(settings: Any) -> set[str]:
    bands = [settings.default_priority_band, *settings.priority_bands]
    refs = {settings.usage_limit_policy_plugin_ref}
    for band in bands:
        if band is not None:
            refs |= {band.ordering_policy_ref, band.fairness_policy_ref}
    return refs


def _restart_only(old: Components, new: Components, data_layer: DataLayerRuntime, app: App) -> None:
    """Log what the new config changes that only a restart applies."""
    if _sync_settings(old) != _sync_settings(new):
        log.warning(
            "config_change_needs_restart",
            field="dataLayer.crossReplicaSyncerPluginRef",
            what="the sync port, peers and interval are bound at startup",
            applied="at the next restart",
        )
    if app.kubernetes is None:
        return
    before = {id(s) for s in app.data_layer.k8s_sources}
    after = {id(s) for s in data_layer.k8s_sources}
    if before != after:
        log.warning(
            "config_change_needs_restart",
            field="dataLayer.sources",
            what="Kubernetes notification sources are wired into the watches at startup",
            applied="at the next restart",
        )


def _sync_settings(components: Components) -> tuple[Any, ...]:
    dl = components.config.data_layer
    if dl is None:
        return ()
    refs = (dl.cross_replica_syncer_plugin_ref, dl.peer_discovery.plugin_ref if dl.peer_discovery else "")
    return (dl.cross_replica_sync_interval, *refs, *(components.specs.get(r) for r in refs if r))


async def _stop(plugin: Lifecycle) -> None:
    try:
        await plugin.stop()
    except Exception:
        log.exception("plugin_stop_failed", plugin=str(getattr(plugin, "typed_name", plugin)))


async def _exit(manager: object) -> None:
    aexit = getattr(manager, "__aexit__", None)
    if aexit is None:
        return
    try:
        await aexit(None, None, None)
    except Exception:
        log.exception("component_stop_failed", component=type(manager).__name__)
