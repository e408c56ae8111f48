"""The data-layer runtime: one poll loop per endpoint, started and stopped as endpoints come and go."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, runtime_checkable

import structlog

from epp.datalayer.api import (
    BindsExtractors,
    DataSource,
    Endpoint,
    EndpointDiscovery,
    EndpointEvent,
    EndpointEventSink,
    EndpointObserver,
    EndpointSink,
    Extractor,
    HasPollTimeout,
    NotificationSource,
    SourceBinding,
)
from epp.datalayer.shared_scrapes import PERIODS, ScrapeShare
from epp.errors import ConfigError
from epp.health.state import SCRAPE_ERROR, SCRAPE_OK, SCRAPE_REFUSED, SCRAPE_TIMEOUT
from epp.plugin.base import Lifecycle

log = structlog.get_logger(__name__)

DEFAULT_REFRESH_INTERVAL: Final = 0.05  # --refresh-metrics-interval
DEFAULT_POLL_TIMEOUT: Final = 1.0  # GIE's; see docs/decisions-datalayer.md for why not < interval
DEFAULT_SLOT: Final = 0.005  # width of a phase slot: loops in one slot poll in one loop iteration
# Loops a slot takes before the next slot opens: a small pool polls in one wake-up per interval
# (4 model servers: 0.015 idle cores against 0.020 with a slot each), a large one in groups of
# this many, so one slot's burst of replies stays about a millisecond of the loop's time.
LOOPS_PER_SLOT: Final = 10


@dataclass(slots=True)
class LoopStats:
    """Counters of one endpoint's loop (cheap ints, read by tests and debug dumps)."""

    ticks: int = 0  # polls attempted
    failures: int = 0  # ticks with any error (poll, timeout or extraction)
    skipped: int = 0  # ticks dropped because a poll overran the interval
    failing: bool = False
    last_error: str = ""


_NEVER: Final = float("inf")


class ObservableEndpoints(Protocol):
    """What the runtime needs of the datastore (which sits above this layer): endpoint events."""

    def add_observer(self, observer: EndpointObserver) -> None: ...

    def remove_observer(self, observer: EndpointObserver) -> None: ...


def _label(plugin: object) -> str:
    return str(getattr(plugin, "typed_name", plugin))


class _Loop:
    """One endpoint's poll loop: its task, counters and the deadline of the poll in flight."""

    __slots__ = ("deadline", "endpoint", "stats", "task", "timed_out")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.stats = LoopStats()
        self.deadline = _NEVER
        self.timed_out = False
        self.task: asyncio.Task[None]


@dataclass(frozen=True, slots=True)
class _Polled:
    source: DataSource
    extractors: tuple[Extractor, ...]
    timeout: float
    label: str
    every: int = 1  # poll on every n-th tick of the endpoint's loop (a source's own ``interval``)
    health: bool = True  # its outcome is a health signal of the endpoint (see ``HEALTH_SIGNAL``)


@runtime_checkable
class SharesScrapes(Protocol):
    """A polling source whose fetched pages the workers of a pod can share (``shared_scrapes``)."""

    def share_scrapes(self, share: ScrapeShare, max_age: float) -> None: ...


@runtime_checkable
class HasPollInterval(Protocol):
    """A polling source with its own scrape period (seconds; None: every tick)."""

    @property
    def poll_interval(self) -> float | None: ...


def period_ticks(interval: float | None, base: float) -> int:
    """Ticks of ``base`` seconds between a source's polls: llm-d-router's ``periodTicks``.

    The nearest multiple, rounded half away from zero as Go's ``math.Round`` (125 ms over
    50 ms is 3, where Python's ``round`` says 2), at least 1; no interval is every tick.
    """
    if base <= 0:
        raise ValueError(f"base tick must be positive, got {base}")
    if not interval or interval <= 0:
        return 1
    # in whole nanoseconds, as Go's durations: 75 ms / 50 ms is 1.5 exactly, not 1.4999...
    ns, base_ns = round(interval * 1e9), round(base * 1e9)
    return max(1, (2 * ns + base_ns) // (2 * base_ns))


class DataLayerRuntime:
    """Polls every endpoint's data sources on a fixed cadence and feeds the extractors.

    An async context manager.  On entry it starts the sources that have a lifecycle, then
    registers itself as a datastore observer, which starts one task per endpoint (and one
    per endpoint added later); removing an endpoint cancels its task.  On exit everything
    is cancelled and awaited and the sources are stopped in reverse order.

    Each loop starts in a phase slot of the interval, then ticks every ``refresh_interval``
    on that slot.  Slots are ``slot`` seconds wide (5 ms: ten slots of a 50 ms interval) on
    one grid shared by every loop, so the polls of a slot share one timer wake-up, their
    requests go out back to back and the replies are read in one batch of ready sockets: at
    100 endpoints every 50 ms this cuts the event-loop and syscall cost of scraping by about a
    third against polls spread uniformly (bench/scrape.py).  A new loop joins the fullest slot
    that has fewer than ``LOOPS_PER_SLOT`` loops, else a random empty one (else the emptiest):
    a small pool shares one wake-up, a large one is spread in groups of that size.  A tick polls each
    source under a deadline (the source's ``poll_timeout``, else ``poll_timeout`` here,
    default 1 s) and runs the source's extractors.  A tick that overruns the interval skips
    the missed ticks instead of queueing them, so a slow server is polled back-to-back at
    most and its loop never overlaps itself.  A failing endpoint only affects its own
    loop; errors are logged on ok→failing and failing→ok transitions, not per tick.

    A source with its own ``poll_interval`` (``HasPollInterval``) is polled on every n-th
    tick only (``period_ticks``); a tick where no source is due does nothing.  A source whose
    class sets ``HEALTH_SIGNAL = False`` (a GPU exporter beside or under the model server) is
    polled first and its outcome is not told to the endpoint's health.

    Notification sources are bound once: endpoint events go to sources that take them
    (``EndpointEventSink``), Kubernetes sources are exposed via ``k8s_sources`` for the
    Kubernetes layer to feed.
    """

    def __init__(
        self,
        datastore: ObservableEndpoints,
        bindings: Sequence[SourceBinding],
        *,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        poll_timeout: float | None = None,
        rng: random.Random | None = None,
        slot: float = DEFAULT_SLOT,
    ) -> None:
        if not bindings:
            raise ConfigError("data layer enabled but no data sources configured")
        self._datastore = datastore
        self._interval = refresh_interval if refresh_interval > 0 else DEFAULT_REFRESH_INTERVAL
        default_timeout = poll_timeout if poll_timeout and poll_timeout > 0 else DEFAULT_POLL_TIMEOUT
        self._rng = rng or random.Random()
        self._slots = max(1, round(self._interval / slot)) if slot > 0 else 1
        self._slot_loops = [0] * self._slots  # loops ticking in each slot
        self._epoch = 0.0  # the shared grid's origin (loop time at entry)
        self._polled: list[_Polled] = []
        self._sinks: list[EndpointEventSink] = []
        self._k8s: list[NotificationSource] = []
        self._sources: list[object] = []
        self._discovery: EndpointDiscovery | None = None
        gvks: dict[str, str] = {}
        for binding in bindings:
            self._wire(binding, default_timeout, gvks)
        # Sources whose outcome says nothing of the model server (a node's GPU exporter) poll
        # first, so the health signal's scrape duration is the model server's alone.
        self._polled.sort(key=lambda p: p.health)
        self._sparse = any(p.every > 1 for p in self._polled)  # some source skips ticks
        timeouts = [p.timeout for p in self._polled]
        self._watch_period = min(max(min(timeouts, default=1.0) / 4, 0.005), 0.25)
        self._watchdog_task: asyncio.Task[None] | None = None
        self._loops: dict[Endpoint, _Loop] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._started: list[Lifecycle | EndpointDiscovery] = []  # what to stop, last first
        self._running = False
        self._share: ScrapeShare | None = None

    def _wire(self, binding: SourceBinding, default_timeout: float, gvks: dict[str, str]) -> None:
        """Validate one binding, bind its extractors and file the source by kind."""
        source: Any = binding.source
        label = _label(source)
        polled = isinstance(source, DataSource)
        if polled:
            for ext in binding.extractors:
                if not isinstance(ext, Extractor):
                    raise ConfigError(f"the plugin {_label(ext)} is not a fwkdl.Extractor")
        if isinstance(source, BindsExtractors):
            source.bind(binding.extractors)
        if polled:
            timeout = default_timeout
            if isinstance(source, HasPollTimeout) and source.poll_timeout:
                timeout = source.poll_timeout
            every = 1
            if isinstance(source, HasPollInterval):
                every = period_ticks(source.poll_interval, self._interval)
            signal = getattr(source, "HEALTH_SIGNAL", True) is not False
            self._polled.append(_Polled(source, binding.extractors, timeout, label, every, signal))
        elif isinstance(source, EndpointDiscovery):
            if self._discovery is not None:
                raise ConfigError(f"only one endpoint discovery plugin can run; {label} is a second")
            if not isinstance(self._datastore, EndpointSink):
                raise ConfigError(f"{label}: this datastore cannot be filled by a discovery plugin")
            self._discovery = source
            return
        elif isinstance(source, NotificationSource):
            gvk = getattr(source, "gvk", None)
            if gvk is not None:
                if str(gvk) in gvks:
                    raise ConfigError(
                        f"duplicate notification source GVK {gvk}: already used by source "
                        f"{gvks[str(gvk)]}, cannot add {label}"
                    )
                gvks[str(gvk)] = label
                self._k8s.append(source)
        else:
            raise ConfigError(f"data source {label} is neither polled nor a notification source")
        if isinstance(source, EndpointEventSink):
            self._sinks.append(source)
        self._sources.append(source)

    # --- context manager -----------------------------------------------------------
    async def __aenter__(self) -> DataLayerRuntime:
        self._bind_share(ScrapeShare.from_env(os.environ))
        try:
            for source in self._sources:
                if isinstance(source, Lifecycle):
                    await source.start()
                    self._started.append(source)
            discovery = self._discovery
            if discovery is not None:  # fills the datastore; the observer below replays what it found
                assert isinstance(self._datastore, EndpointSink)
                self._started.append(discovery)
                await discovery.start_discovery(self._datastore)
        except BaseException:
            await self._stop_sources()
            self._close_share()
            raise
        self._running = True
        self._epoch = asyncio.get_running_loop().time()
        if self._polled:
            self._watchdog_task = asyncio.get_running_loop().create_task(
                self._watchdog(), name="datalayer:watchdog"
            )
        self._datastore.add_observer(self)  # replays the endpoints already known
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._running = False
        self._datastore.remove_observer(self)
        for lp in self._loops.values():
            lp.endpoint.health.leave()  # no longer scraped: not a peer any more
            lp.task.cancel()
            self._stopping.add(lp.task)
        self._loops.clear()
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
            self._stopping.add(self._watchdog_task)
            self._watchdog_task = None
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
            self._stopping.clear()
        await self._stop_sources()
        self._close_share()

    def _bind_share(self, share: ScrapeShare | None) -> None:
        """``--workers N``: the sources that can fetch once per pod do (``shared_scrapes``); a page
        is reused while younger than ``PERIODS`` of its source's polling period."""
        if share is None:
            return
        shared = [p for p in self._polled if isinstance(p.source, SharesScrapes)]
        if not shared:
            share.close()
            return
        self._share = share
        for p in shared:
            assert isinstance(p.source, SharesScrapes)
            p.source.share_scrapes(share, PERIODS * p.every * self._interval)
        log.info("scrapes_shared", publishing=share.publishing, sources=[p.label for p in shared])

    def _close_share(self) -> None:
        if self._share is not None:
            self._share.close()
            self._share = None

    async def _stop_sources(self) -> None:
        while self._started:
            source = self._started.pop()
            try:
                await source.stop()
            except Exception as e:
                log.exception("data_source_stop_failed", source=_label(source), error=str(e))

    # --- datastore observer ----------------------------------------------------------
    def endpoint_added(self, endpoint: Endpoint) -> None:
        if not self._running or endpoint in self._loops:
            return
        endpoint.health.join()  # a peer in the health pool while it is scraped
        if self._polled:
            lp = _Loop(endpoint)
            lp.task = asyncio.get_running_loop().create_task(self._run(lp), name=f"datalayer:{endpoint.name}")
            self._loops[endpoint] = lp
        self._notify(EndpointEvent("AddOrUpdate", endpoint))

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        endpoint.health.leave()
        lp = self._loops.pop(endpoint, None)
        if lp is not None:
            task = lp.task
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        if self._running:
            self._notify(EndpointEvent("Delete", endpoint))

    def _notify(self, event: EndpointEvent) -> None:
        for sink in self._sinks:
            try:
                sink.endpoint_event(event)
            except Exception as e:
                log.exception(
                    "endpoint_event_failed", endpoint=event.endpoint.name, event=event.type, error=str(e)
                )

    # --- introspection ---------------------------------------------------------------
    @property
    def refresh_interval(self) -> float:
        return self._interval

    @property
    def active_loops(self) -> int:
        """Loop tasks alive, including removed endpoints' tasks still unwinding."""
        live = sum(1 for lp in self._loops.values() if not lp.task.done())
        return live + sum(1 for t in self._stopping if not t.done() and t is not self._watchdog_task)

    def stats(self, endpoint: Endpoint) -> LoopStats | None:
        lp = self._loops.get(endpoint)
        return None if lp is None else lp.stats

    @property
    def scrape_share(self) -> ScrapeShare | None:
        """The pod's page channel when its workers share scrapes (``--workers N``), else None."""
        return self._share

    @property
    def k8s_sources(self) -> tuple[NotificationSource, ...]:
        """Notification sources the Kubernetes layer must feed (each has ``gvk`` and ``notify``)."""
        return tuple(self._k8s)

    # --- the loop --------------------------------------------------------------------
    def _take_slot(self) -> int:
        """The slot a new loop ticks in (see the class docstring); the caller gives it back."""
        loads = self._slot_loops
        best = -1
        for i, n in enumerate(loads):
            if 0 < n < LOOPS_PER_SLOT and (best < 0 or n > loads[best]):
                best = i
        if best < 0:
            empty = [i for i, n in enumerate(loads) if n == 0]
            best = self._rng.choice(empty) if empty else loads.index(min(loads))
        loads[best] += 1
        return best

    async def _run(self, lp: _Loop) -> None:
        slot = self._take_slot()
        try:
            await self._ticks(lp, slot)
        finally:
            self._slot_loops[slot] -= 1

    async def _ticks(self, lp: _Loop, slot: int) -> None:
        loop = asyncio.get_running_loop()
        interval = self._interval
        stats = lp.stats
        # The first due time: this loop's slot in the current (or next) interval of the grid.
        now = loop.time()
        since = now - self._epoch
        due = self._epoch + (since - since % interval) + slot * interval / self._slots
        if due < now:
            due += interval
        while True:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._tick(lp, due)
            due += interval
            now = loop.time()
            if due <= now:  # overran: drop the missed ticks, stay on this loop's grid
                missed = int((now - due) // interval) + 1
                due += missed * interval
                stats.skipped += missed

    async def _tick(self, lp: _Loop, due: float) -> None:
        """One round of polls; deadlines count from the tick's due time (saves a clock read).

        The endpoint's health hears when the round starts and how its polls ended: a refused
        connection, a timeout, or a scrape still in flight far longer than usual are its signals.
        """
        stats = lp.stats
        endpoint = lp.endpoint
        health = endpoint.health
        nth = stats.ticks
        stats.ticks += 1
        if self._sparse and all(nth % p.every for p in self._polled):
            return  # no source is due on this tick: nothing polled, nothing for health to hear
        errors: list[str] | None = None
        outcome = SCRAPE_OK
        heard = False  # a source whose outcome is a health signal polled
        for polled in self._polled:
            if nth % polled.every:
                continue
            if polled.health and not heard:
                heard = True
                health.scrape_started(time.monotonic())
            lp.deadline = due + polled.timeout
            try:
                data = await polled.source.poll(endpoint)
            except asyncio.CancelledError:
                if not self._timed_out(lp):
                    raise
                errors = errors or []
                errors.append(f"{polled.label}: poll timed out after {polled.timeout:g}s")
                if polled.health and outcome != SCRAPE_REFUSED:
                    outcome = SCRAPE_TIMEOUT
                continue
            except Exception as e:
                errors = errors or []
                errors.append(f"{polled.label}: {e}")
                if not polled.health:
                    pass
                elif isinstance(e, ConnectionError):  # refused or reset: nothing listens there
                    outcome = SCRAPE_REFUSED
                elif outcome == SCRAPE_OK:
                    outcome = SCRAPE_ERROR
                continue
            finally:
                lp.deadline = _NEVER
            for ext in polled.extractors:
                try:
                    ext.extract(data, endpoint)
                except Exception as e:
                    errors = errors or []
                    errors.append(f"{ext.typed_name}: {e}")
        if heard:
            health.scrape_ended(outcome, time.monotonic())
        if errors is None:
            if stats.failing:
                stats.failing = False
                stats.last_error = ""
                log.info("endpoint_data_recovered", endpoint=endpoint.name)
            return
        stats.failures += 1
        stats.last_error = "; ".join(errors)
        if not stats.failing:
            stats.failing = True
            log.error("endpoint_data_failed", endpoint=endpoint.name, error=stats.last_error)

    @staticmethod
    def _timed_out(lp: _Loop) -> bool:
        """Whether a CancelledError came from the watchdog alone (then it is absorbed)."""
        if not lp.timed_out:
            return False
        lp.timed_out = False
        lp.task.uncancel()
        return lp.task.cancelling() == 0  # also cancelled by someone else: let it through

    async def _watchdog(self) -> None:
        """Cancels polls past their deadline: one timer for all loops instead of one per poll.

        A per-poll ``asyncio.timeout`` costs about as much CPU as the poll's own wake-up;
        checking every loop's deadline a few times per timeout costs almost nothing, and a
        timeout fires at most one check period late.
        """
        loop = asyncio.get_running_loop()
        period = self._watch_period
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for lp in self._loops.values():
                if lp.deadline < now and not lp.timed_out:
                    lp.timed_out = True
                    lp.task.cancel()
