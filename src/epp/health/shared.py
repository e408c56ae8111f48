"""Ejections shared between the workers of a pod (and active-active replicas) over the sync hub.

Each process judges endpoint health from its own traffic (``HEALTH`` is per process), so with
``--workers N`` an endpoint one worker ejected after five 5xx kept taking the other workers'
requests until each had seen its own five.  ``HealthExchange`` is a ``Replicated`` the sync hub
binds beside the config's plugins: an ejection here is sent to the peers as (endpoint, seconds
left, reason, ejection count), and a peer's ejection is adopted (``EndpointHealth.adopt_ejection``:
the same probe and backoff as one seen here, within this process's own ejection budget).

Only ejections travel: they are rare (never per request), and they are what a peer cannot learn
soon by itself.  Unreachable endpoints are not sent (every process scrapes and sees the refusal);
penalties (time-to-first-token outliers) stay local, since latency is judged against what this
process observed.  Durations, not deadlines, cross the wire: peers' clocks differ.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Final

from epp.health.pool import HEALTH, HealthPool
from epp.health.state import EJECTED, EndpointHealth

SYNC_KEY: Final = "epp/endpoint-health"
MAX_DELTAS: Final = 1024  # a batch larger than this is not one a peer sends


def _delta(h: EndpointHealth, now: float) -> list[Any]:
    return [h.name, max(0.0, h.ejected_until - now), h.reason, h.ejections]


class HealthExchange:
    """The pool's ejections as ``Replicated`` state (``epp.plugin.replicated``)."""

    sync_key = SYNC_KEY

    def __init__(self, pool: HealthPool = HEALTH, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self._clock = clock
        self._pending: list[list[Any]] | None = None  # None: not drained yet, so nobody listens
        self._applying = False
        self.sync_dirty: Callable[[], None] | None = None  # set by the hub: drain this tick
        self.adopted = 0  # ejections taken from peers (tests and /debug read it)
        pool.on_eject = self._ejected

    def _ejected(self, health: EndpointHealth) -> None:
        if self._applying or self._pending is None:
            return  # a peer's ejection adopted here is not ours to send back
        self._pending.append(_delta(health, health.since))
        if self.sync_dirty is not None:
            self.sync_dirty()

    # --- Replicated ------------------------------------------------------------------------
    def drain(self) -> list[Any]:
        out, self._pending = self._pending or [], []
        return out

    def apply(self, origin: str, deltas: list[Any]) -> None:
        checked = _parse(deltas)
        now = self._clock()
        longest = self.pool.policy.max_ejection_time  # no peer ejects for longer than the policy allows
        self._applying = True
        try:
            for name, seconds, reason, ejections in checked:
                health = self.pool.member(name)
                if health is not None and health.adopt_ejection(
                    reason, min(seconds, longest), ejections, now
                ):
                    self.adopted += 1
        finally:
            self._applying = False

    def forget(self, origin: str) -> None:
        """An ejection is a verdict on the endpoint, not the origin's work in flight: it stays and
        expires on its own clock."""

    def snapshot(self) -> Any:
        now = self._clock()
        return [_delta(h, now) for h in self.pool.members if h.status is EJECTED and h.ejected_until > now]

    def restore(self, snapshot: Any) -> None:
        self.apply("", snapshot)


def _parse(deltas: Any) -> list[tuple[str, float, str, int]]:
    """A peer's ``[[endpoint, seconds, reason, ejections], ...]``, checked whole before any is used."""
    if not isinstance(deltas, list) or len(deltas) > MAX_DELTAS:
        raise ValueError(f"{SYNC_KEY}: expected a list of at most {MAX_DELTAS} ejections")
    out = []
    for d in deltas:
        if (
            not isinstance(d, (list, tuple))
            or len(d) != 4
            or not isinstance(d[0], str)
            or not isinstance(d[1], (int, float))
            or isinstance(d[1], bool)
            or not math.isfinite(d[1])
            or not isinstance(d[2], str)
            or not isinstance(d[3], int)
        ):
            raise ValueError(f"{SYNC_KEY}: expected [endpoint, seconds, reason, ejections], got {d!r:.80}")
        out.append((d[0], float(d[1]), d[2], d[3]))
    return out


EXCHANGE: Final = HealthExchange()
