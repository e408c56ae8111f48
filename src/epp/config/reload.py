"""Change the config while serving: re-read, validate and build off the request path, swap at once.

``ConfigReloader`` (an async context manager, entered once the EPP has started) watches
``--config-file`` (``watcher.ConfigWatcher``; SIGHUP re-reads at once) and applies a changed
EndpointPickerConfig in three steps:

1. **Build, off the event loop.**  Parsing, validation and plugin construction run in a
   worker thread (``asyncio.to_thread``) with the builder told the config serving now
   (``BuildOptions.previous``): a plugin whose name, type and parameters are unchanged is
   taken over as the same instance, so its state (prefix index, in-flight counters,
   trained latency model) survives.  Any error is a ``ConfigError`` naming the field; the
   reload is then rejected and the old config keeps serving.
2. **Start what is new, on the loop.**  New plugins with a lifecycle are started; flow
   control (and its queues) is kept when its settings, detector and policies are the
   same objects, else a new controller starts; the data layer (its poll loops) is kept
   when its bindings are the same plugins, else a new runtime takes over.
3. **Swap.**  ``Director.swap`` makes the new pipeline the one new requests start on, in
   one assignment; requests in flight finish on the pipeline they started with.  What the
   new config no longer uses (plugins with a lifecycle, a replaced flow controller,
   datastore observers) is stopped once no request uses the old pipeline any more.

What a config file cannot change live: command-line flags (ports, TLS, transport, pool,
intervals) are not in the file, and the Kubernetes notification sources are wired into the
watches at startup (a change to them is logged as needing a restart).  A parser that does
not serve the pool's ``appProtocol`` is rejected rather than making the EPP unready.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol

import structlog

from epp.admission.api import AdmissionController
from epp.admission.assembly import AdmissionPlan
from epp.config.build import BuildOptions, Components, build, parser_supports
from epp.config.load import DEFAULT_CONFIG_YAML, load_config
from epp.config.registry import default_registry
from epp.config.watcher import ConfigWatcher, digest
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.sources.metrics_http import ModelServerMetricsFlags
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import ConfigError
from epp.metrics import series
from epp.plugin.base import Lifecycle
from epp.plugin.registry import Registry

log = structlog.get_logger(__name__)

SUCCESS: Final = "success"
FAILURE: Final = "failure"
UNCHANGED: Final = "unchanged"
DRAIN_LIMIT: Final = 600.0  # seconds a replaced pipeline may stay in use before its plugins stop anyway
DRAIN_POLL: Final = 0.05
BUILD_SWITCH_INTERVAL: Final = 0.0005
RESTART_ONLY: Final = "command-line flags (ports, TLS mode, ext_proc transport, pool, intervals)"


class ReloadOptions(Protocol):
    """The flags a reload reads (``epp.cli.flags.Options`` has them)."""

    @property
    def config_file(self) -> str: ...
    @property
    def config_text(self) -> str: ...
    @property
    def config_reload_interval(self) -> float: ...
    @property
    def model_server_metrics(self) -> ModelServerMetricsFlags: ...
    @property
    def refresh_metrics_interval(self) -> float: ...


class LiveApp(Protocol):
    """What the reloader reads and replaces (``epp.cli.run.App``)."""

    components: Components
    data_layer: DataLayerRuntime
    admission: AdmissionController

    @property
    def options(self) -> ReloadOptions: ...
    @property
    def director(self) -> Director: ...
    @property
    def datastore(self) -> Datastore: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def kubernetes(self) -> object | None: ...


@dataclass(slots=True)
class _Retiring:
    """What the previous config used and the new one does not; stopped once ``director`` drains."""

    director: Director
    plugins: tuple[Lifecycle, ...]
    admission: AdmissionController | None
    observers: tuple[Any, ...]


class ConfigReloader:
    """Watch the config and apply changes live; see the module docstring.

    ``reload(content)`` is the one way in (the watcher and SIGHUP call it; tests may too);
    it returns ``"success"``, ``"failure"`` or ``"unchanged"`` and counts it in
    ``inference_extension_config_reload_total{result}``.
    """

    def __init__(self, app: LiveApp, *, registry: Registry | None = None) -> None:
        self.app = app
        opts = app.options
        self.path = opts.config_file
        self._registry = registry
        self._lock = asyncio.Lock()
        self._watcher: ConfigWatcher | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._original: tuple[Components, DataLayerRuntime, AdmissionController] = (
            app.components,
            app.data_layer,
            app.admission,
        )
        self.generation = 1
        self.digest = ""
        self.last_error = ""
        self.last_swap_seconds = 0.0  # on the event loop, starting new plugins included

    # --- context manager -------------------------------------------------------------
    async def __aenter__(self) -> ConfigReloader:
        opts = self.app.options
        loop = asyncio.get_running_loop()
        if self.path:
            content, serving = await asyncio.to_thread(self._startup_content)
            self.digest = digest(content)
            self._watcher = ConfigWatcher(self.path, self._changed, interval=opts.config_reload_interval)
            if serving:  # else the file changed since startup read it: the first polls apply it
                self._watcher.seen(self.digest)
            self._watcher.start()
            log.info(
                "config_reload_enabled",
                file=self.path,
                poll_seconds=opts.config_reload_interval if opts.config_reload_interval > 0 else None,
                sighup=True,
                restart_required_for=RESTART_ONLY,
            )
        else:
            self.digest = digest((opts.config_text or DEFAULT_CONFIG_YAML).encode())
            log.info(
                "config_reload_unavailable",
                reason="the config is given inline (--config-text)"
                if opts.config_text
                else "no --config-file (the built-in default config serves)",
                hint="restart to change the config; SIGHUP has nothing to re-read",
            )
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self._sighup)
        series.CONFIG_GENERATION.clear()
        series.CONFIG_GENERATION.labels(self.digest).set(self.generation)
        series.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)
        series.CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP.set(time.time())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._watcher is not None:
            await self._watcher.stop()
        async with self._lock:  # no reload half-done
            for task in tuple(self._retiring):
                task.cancel()  # its finally-block stops what it retires, without waiting
            await asyncio.gather(*self._retiring, return_exceptions=True)
            # What a reload started is ours to stop; the startup set is the caller's.
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

    def _startup_content(self) -> tuple[bytes, bool]:
        """The file now, and whether it is the config serving (it may have changed since startup)."""
        try:
            content = _read(self.path)
            return content, load_config(content) == self.app.components.config
        except (OSError, ConfigError):
            return b"", False

    def _sighup(self) -> None:
        if self._watcher is not None:
            log.info("config_reload_signal", signal="SIGHUP", file=self.path)
            self._watcher.hup()
        else:
            log.warning(
                "config_reload_unavailable",
                signal="SIGHUP",
                reason="the config is not read from a file (--config-file)",
            )

    async def _changed(self, content: bytes, content_digest: str, trigger: str) -> None:
        await self.reload(content, trigger=trigger, content_digest=content_digest)

    # --- reload ----------------------------------------------------------------------
    async def reload(self, content: bytes, *, trigger: str = "api", content_digest: str = "") -> str:
        """Apply ``content`` if it is a valid, different config; returns the result."""
        content_digest = content_digest or digest(content)
        async with self._lock:
            started = time.monotonic()
            current = self.app.components
            try:
                with _fine_gil_switching():
                    new = await asyncio.to_thread(self._build, content, current)
                if new is not None:
                    swap_started = time.perf_counter()
                    await self._swap(new)
                    self.last_swap_seconds = time.perf_counter() - swap_started
            except ConfigError as e:
                return self._failed(str(e), content_digest, trigger)
            except Exception as e:  # a plugin's start() is foreign code: reject, keep serving
                return self._failed(f"applying the new config failed: {e!r}", content_digest, trigger)
            seconds = round(time.monotonic() - started, 4)
            if new is None:  # the file says what serves (also after a rejected version)
                series.CONFIG_RELOAD_TOTAL.labels(UNCHANGED).inc()
                series.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)
                log.info("config_reload_unchanged", file=self.path, hash=content_digest, trigger=trigger)
                return UNCHANGED
            self.generation += 1
            self.digest = content_digest
            self.last_error = ""
            series.CONFIG_RELOAD_TOTAL.labels(SUCCESS).inc()
            series.CONFIG_GENERATION.clear()
            series.CONFIG_GENERATION.labels(content_digest).set(self.generation)
            series.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)
            series.CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP.set(time.time())
            log.info(
                "config_reloaded",
                file=self.path,
                hash=content_digest,
                generation=self.generation,
                trigger=trigger,
                seconds=seconds,
                swap_seconds=round(self.last_swap_seconds, 6),  # of which on the event loop
                kept=sorted(new.reused),
                built=sorted(set(new.plugins) - new.reused),
                dropped=sorted(set(current.plugins) - set(new.plugins)),
            )
            return SUCCESS

    def _failed(self, error: str, content_digest: str, trigger: str) -> str:
        self.last_error = error
        series.CONFIG_RELOAD_TOTAL.labels(FAILURE).inc()
        series.CONFIG_LAST_RELOAD_SUCCESSFUL.set(0)
        log.error(
            "config_reload_failed",
            file=self.path,
            hash=content_digest,
            trigger=trigger,
            error=error,
            kept=f"generation {self.generation} ({self.digest})",
        )
        return FAILURE

    def _build(self, content: bytes, current: Components) -> Components | None:
        """In a worker thread: parse, validate, build (reusing unchanged plugins); None if unchanged."""
        where = f"{self.path}: " if self.path else ""
        try:
            config = load_config(content)
        except ConfigError as e:
            raise ConfigError(f"{where}{e}") from None
        if config == current.config:
            return None
        if self._registry is None:
            self._registry = default_registry()
        options = BuildOptions(
            metrics=self.app.options.model_server_metrics, env=self.app.env, previous=current
        )
        try:
            new = build(config, self._registry, options)
        except ConfigError as e:
            raise ConfigError(f"{where}{e}") from None
        pool = self.app.datastore.pool
        protocol = pool.app_protocol if pool is not None else ""
        if not parser_supports(new.parser, protocol):
            raise ConfigError(
                f"{where}parser.pluginRef: parser '{new.parser.typed_name}' does not serve the pool's "
                f"appProtocol '{protocol or 'http'}'"
            )
        return new

    async def _swap(self, new: Components) -> None:
        """Start what is new, swap the pipeline, retire what is no longer used (see module doc)."""
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
                staleness_threshold=p.staleness_threshold,
            )
        )
        replaced_admission = app.admission if admission is not app.admission else None
        app.components, app.admission, app.data_layer = new, admission, data_layer
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

    @property
    def watcher(self) -> ConfigWatcher | None:
        """The file watcher (None when the config is not read from a file)."""
        return self._watcher

    @property
    def retiring(self) -> int:
        """Replaced pipelines whose plugins still wait for their requests to finish."""
        return len(self._retiring)


@contextlib.contextmanager
def _fine_gil_switching() -> Iterator[None]:
    """While the build thread runs, hand the GIL back to the event loop within 0.5 ms.

    The build is pure Python (YAML, pydantic, plugin constructors; ~3 ms for a typical
    config); with the default 5 ms switch interval each wake-up of the event loop waited
    up to 5 ms for the GIL while it ran (bench/reload.py).  One reload runs at a time.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, BUILD_SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


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


def _restart_only(old: Components, new: Components, data_layer: DataLayerRuntime, app: LiveApp) -> None:
    """Log what the new config changes that only a restart applies."""
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


__all__: Sequence[str] = ("FAILURE", "SUCCESS", "UNCHANGED", "ConfigReloader", "LiveApp")
