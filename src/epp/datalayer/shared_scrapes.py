"""One scrape per pod: with ``--workers N`` worker 0 fetches the model servers' pages, the others reuse them.

Every worker scraping every model server every tick cost each worker 4-5% of its core at
capacity (py-spy, ``bench.scaleout --part workers``: the HTTP exchange, not the parse) and
the model servers N scrapes per tick.  So worker 0 republishes each page a
``metrics-data-source`` fetched on a PUB socket in the pod's run directory
(``ipc://<run dir>/scrapes.pub``); the other workers' SUB connects there
(``EPP_SCRAPE_SHARE=bind:…|connect:…``, set by the supervisor as it sets the KV-events relay).
A sibling's poll takes the newest page worker 0 fetched for that endpoint and parses and
extracts it itself, so its extractors, attributes and endpoint health run as before; the
HTTP round trip, and its wake-ups, are worker 0's alone.

**Bound.** A page is used only while it is younger than ``max_age``: two of the source's
polling periods (100 ms at the default 50 ms tick), counted from when worker 0 received it.
Two workers poll an endpoint at independent phases of one period, so in steady state the
newest page is at most one period old when a sibling polls; past two, worker 0 missed a
poll (a refused or slow scrape, a restart, a death) and the sibling scrapes the endpoint
itself, on that poll: its own scrape sees what worker 0 saw (a refusal, a timeout) and
its health reacts as before, one bound late.  When worker 0 is back, its pages are fresh
again and the sibling stops scraping.  ``CLOCK_MONOTONIC`` is one clock for every process
of a host, so the age needs no wall clock.

Receiving costs no wake-up: libzmq's I/O thread queues the pages (at most ``HWM``), and a
sibling's poll drains the queue without blocking, keeping the newest page per endpoint.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Mapping
from typing import Final

import structlog
import zmq

from epp.errors import ConfigError
from epp.metrics.fast import Counter
from epp.metrics.series import REGISTRY

log = structlog.get_logger(__name__)

SHARE_ENV: Final = "EPP_SCRAPE_SHARE"
PERIODS: Final = 2  # a shared page is used while younger than this many polling periods
HWM: Final = 10_000  # pages queued per socket; past it a publish is dropped (the sibling scrapes)
_TIME: Final = struct.Struct("<d")

# Summed over the workers at /metrics (one series per pod): ``fetched`` is what the model servers
# were asked (worker 0's scrapes and the others' fallbacks), ``shared`` the polls a page served.
PAGES: Final = Counter(
    "epp_scrape_pages_total",
    "Metrics pages the pod's workers polled, by whether they were fetched or reused from worker 0.",
    ("outcome",),
    registry=REGISTRY,
)
_FETCHED: Final = PAGES.labels(outcome="fetched")
_SHARED: Final = PAGES.labels(outcome="shared")


class ScrapeShare:
    """Worker 0's end (``publishing``) or a sibling's end of the pod's page channel."""

    def __init__(
        self,
        mode: str,
        address: str,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("bind", "connect") or not address:
            raise ConfigError(
                f"{SHARE_ENV}: expected bind:<address> or connect:<address>, got {mode}:{address}"
            )
        ctx = context or zmq.Context.instance()
        self.publishing = mode == "bind"
        self._clock = clock
        self._sock: zmq.Socket[bytes] = ctx.socket(zmq.PUB if self.publishing else zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM if self.publishing else zmq.RCVHWM, HWM)
        try:
            if self.publishing:
                self._sock.bind(address)
            else:
                self._sock.setsockopt(zmq.SUBSCRIBE, b"")
                self._sock.connect(address)
        except zmq.ZMQError as e:
            self._sock.close(linger=0)
            raise ConfigError(f"{SHARE_ENV}: cannot {mode} {address}: {e}") from e
        self._latest: dict[bytes, tuple[float, bytes]] = {}
        self.published = 0  # pages sent (worker 0)
        self.dropped = 0  # pages the queue refused (worker 0)
        self.used = 0  # polls answered with worker 0's page (a sibling)
        self.stale = 0  # polls that found none younger than the bound and scraped (a sibling)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ScrapeShare | None:
        """The channel the supervisor set up for this worker; None without one (``--workers 1``)."""
        raw = env.get(SHARE_ENV, "")
        if not raw:
            return None
        mode, _, address = raw.partition(":")
        return cls(mode, address)

    def publish(self, key: bytes, body: bytes) -> None:
        """Worker 0: a page it fetched, stamped now.  Never blocks; a full queue drops it."""
        _FETCHED.inc()
        try:
            self._sock.send_multipart((key, _TIME.pack(self._clock()), body), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
        else:
            self.published += 1

    def fresh(self, key: bytes, max_age: float) -> bytes | None:
        """A sibling: worker 0's newest page for ``key`` if younger than ``max_age``, else None."""
        self._drain()
        got = self._latest.get(key)
        if got is not None and self._clock() - got[0] <= max_age:
            self.used += 1
            _SHARED.inc()
            return got[1]
        self.stale += 1
        _FETCHED.inc()  # the caller scrapes the endpoint itself
        return None

    def forget(self, key: bytes) -> None:
        """An endpoint that left: drop its page (up to the source's maximum body size)."""
        self._latest.pop(key, None)

    def close(self) -> None:
        self._sock.close(linger=0)
        self._latest.clear()

    def _drain(self) -> None:
        sock, latest, unpack = self._sock, self._latest, _TIME.unpack
        while int(sock.get(zmq.EVENTS)) & zmq.POLLIN:  # asking is cheaper than a zmq.Again raised per poll
            frames = sock.recv_multipart(zmq.NOBLOCK)
            if len(frames) == 3 and len(frames[1]) == _TIME.size:  # only worker 0 writes here
                latest[frames[0]] = (unpack(frames[1])[0], frames[2])
