"""Change the config while serving: re-read, validate and build off the request path, swap at once.

``ConfigReloader`` (an async context manager, entered once the EPP has started) watches
``--config-file`` (``watcher.ConfigWatcher``; SIGHUP re-reads at once) and applies a changed
EndpointPickerConfig in two steps:

1. **Build, off the event loop.**  Parsing, validation and plugin construction run in a
   worker thread (``asyncio.to_thread``) with the builder told the config serving now
   (``BuildOptions.previous``): a plugin whose name, type and parameters are unchanged is
   taken over as the same instance, so its state (prefix index, in-flight counters,
   trained latency model) survives.  Any error is a ``ConfigError`` naming the field; the
   reload is then rejected and the old config keeps serving.
2. **Swap, on the loop** (``swap.ConfigSwap``).  What is new starts, flow control and the
   data layer are kept when their parts are the same objects, ``Director.swap`` makes the
   new pipeline the one new requests start on (requests in flight finish on theirs), and
   what the new config no longer uses is stopped once no request uses the old pipeline.

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
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Final

import structlog

from epp.app.build import BuildOptions, Components, build, parser_supports
from epp.app.compose import App
from epp.app.registry import default_registry
from epp.app.swap import ConfigSwap
from epp.app.watcher import ConfigWatcher, digest
from epp.config.load import DEFAULT_CONFIG_YAML, load_config
from epp.errors import ConfigError
from epp.metrics import series
from epp.plugin.registry import Registry

log = structlog.get_logger(__name__)

SUCCESS: Final = "success"
FAILURE: Final = "failure"
UNCHANGED: Final = "unchanged"
BUILD_SWITCH_INTERVAL: Final = 0.0005
RESTART_ONLY: Final = "command-line flags (ports, TLS mode, ext_proc transport, pool, intervals)"


class ConfigReloader:
    """Watch the config and apply changes live; see the module docstring.

    ``reload(content)`` is the one way in (the watcher and SIGHUP call it; tests may too);
    it returns ``"success"``, ``"failure"`` or ``"unchanged"`` and counts it in
    ``inference_extension_config_reload_total{result}``.
    """

    def __init__(self, app: App, *, registry: Registry | None = None) -> None:
        self.app = app
        opts = app.options
        self.path = opts.config_file
        self._registry = registry
        self._lock = asyncio.Lock()
        self._watcher: ConfigWatcher | None = None
        self._swap = ConfigSwap(app)
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
            await self._swap.close()

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
                    await self._swap.swap(new)
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

    @property
    def watcher(self) -> ConfigWatcher | None:
        """The file watcher (None when the config is not read from a file)."""
        return self._watcher

    @property
    def retiring(self) -> int:
        """Replaced pipelines whose plugins still wait for their requests to finish."""
        return self._swap.retiring


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


__all__: Sequence[str] = ("FAILURE", "SUCCESS", "UNCHANGED", "ConfigReloader")
