"""Passive health of an endpoint: what scraping and responses say about it, as Envoy's outlier
detection would, so a dead or failing replica stops being picked in milliseconds, not seconds.

Two signals, both free (no extra probes):

* **Unreachable**: the metrics scrape could not connect (refused, reset, no route).  A crashed
  replica refuses connections at once, long before its metrics go stale (2 s); the next
  successful scrape clears the mark.
* **Ejected**: ``CONSECUTIVE_5XX`` responses in a row with status >= 500 (the replica answers
  but fails, or Envoy could not reach it) eject it for ``BASE_EJECTION`` seconds, doubling
  with each ejection up to ``MAX_EJECTION``; a success resets the streak and, once not ejected,
  the ejection count.

Candidates exclude unavailable endpoints unless that would leave none: routing to a replica
that may be failing beats refusing every request (Envoy's panic threshold, reduced to 0%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

CONSECUTIVE_5XX: Final = 3
BASE_EJECTION: Final = 10.0  # Envoy: 30 s; a replica that recovers should not wait that long
MAX_EJECTION: Final = 300.0  # Envoy's max_ejection_time


@dataclass(slots=True)
class EndpointHealth:
    unreachable: bool = False
    consecutive_5xx: int = 0
    ejections: int = 0
    ejected_until: float = 0.0

    def available(self, now: float) -> bool:
        return not self.unreachable and now >= self.ejected_until

    def scraped(self, ok: bool) -> None:
        """A scrape finished: ``ok`` False only for connection failures (a slow /metrics is not death)."""
        self.unreachable = not ok

    def response(self, status: int, now: float) -> bool:
        """Count one response; True when this one ejected the endpoint."""
        if status < 500:
            self.consecutive_5xx = 0
            if now >= self.ejected_until:
                self.ejections = 0
            return False
        self.consecutive_5xx += 1
        if self.consecutive_5xx < CONSECUTIVE_5XX or now < self.ejected_until:
            return False
        self.consecutive_5xx = 0
        self.ejections += 1
        self.ejected_until = now + min(MAX_EJECTION, BASE_EJECTION * 2.0 ** (self.ejections - 1))
        return True


class HasHealth(Protocol):
    @property
    def health(self) -> EndpointHealth: ...


T = TypeVar("T", bound=HasHealth)


def available_or_all(endpoints: Sequence[T], now: float) -> Sequence[T]:
    """The available endpoints, or all of them when none is (fail open)."""
    for ep in endpoints:
        if not ep.health.available(now):
            break
    else:
        return endpoints  # the common case: no list built
    available = [ep for ep in endpoints if ep.health.available(now)]
    return available or endpoints
