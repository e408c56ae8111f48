"""The owner of endpoint health: the policy, the endpoints that are peers, and the transitions.

Every ``EndpointHealth`` reports to its pool: the pool answers what needs the other endpoints
(the ejection budget, the peers' latency references, whether a stall is the whole fleet's or
our own event loop's rather than one endpoint's) and turns each state change into a log line and
metrics.  One process serves one pool, so the EPP has one ``HEALTH``; tests build their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import structlog

from epp.health.metrics import HEALTH_STATE, HEALTH_TRANSITIONS
from epp.health.policy import DEFAULT_POLICY, HealthPolicy
from epp.health.state import EJECTED, PROBING, EndpointHealth, Status

log = structlog.get_logger(__name__)

REFS_TTL: Final = 0.1  # seconds an endpoint keeps its peers' medians before asking again


def _median(values: list[float], *, upper: bool = False) -> float:
    """The median (0.0 of nothing); ``upper``: of an even count, the higher middle value."""
    if not values:
        return 0.0
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 or upper else (values[mid - 1] + values[mid]) / 2


class HealthPool:
    """The endpoints whose health is judged together, under one ``HealthPolicy``."""

    __slots__ = ("_members", "on_eject", "policy", "refs_ttl", "watch")

    def __init__(self, policy: HealthPolicy = DEFAULT_POLICY, *, refs_ttl: float = REFS_TTL) -> None:
        self._members: dict[EndpointHealth, None] = {}  # an ordered set
        self.refs_ttl = refs_ttl
        self.policy = policy
        self.watch = 0.0
        # Told of every ejection this pool makes (epp.health.shared: the pod's other workers adopt it).
        self.on_eject: Callable[[EndpointHealth], None] | None = None
        self.configure(policy)

    def configure(self, policy: HealthPolicy) -> None:
        """Adopt ``policy`` (a config load or reload); states already reached are kept."""
        self.policy = policy
        # How long requests may wait without headers before ``available`` looks closer.
        self.watch = min(policy.scrape_hang_time, policy.no_headers_time)
        for m in self._members:
            m.requiet()

    # --- membership --------------------------------------------------------------------------
    def join(self, health: EndpointHealth) -> None:
        self._members[health] = None
        HEALTH_STATE.labels(health.name).set(int(health.status))

    def leave(self, health: EndpointHealth) -> None:
        if self._members.pop(health, 0) is None:
            HEALTH_STATE.remove(health.name)

    @property
    def members(self) -> tuple[EndpointHealth, ...]:
        return tuple(self._members)

    def member(self, name: str) -> EndpointHealth | None:
        """The member called ``name`` (O(members): only on the rare paths)."""
        return next((m for m in self._members if m.name == name), None)

    # --- what needs the peers ------------------------------------------------------------------
    def ejection_allowed(self, health: EndpointHealth, now: float) -> bool:
        """Whether one more endpoint may be ejected: never more than ``maxEjectionPercent`` of the
        pool, but always at least one (Envoy's rule).  Unreachable endpoints do not count: nothing
        listens there, so keeping them is no choice."""
        members = self._members
        if health not in members:
            return True
        limit = max(1, math.floor(len(members) * self.policy.max_ejection_percent / 100.0))
        ejected = sum(1 for m in members if m is not health and m.status is EJECTED and now < m.ejected_until)
        return ejected < limit

    def peers_stuck(self, health: EndpointHealth, now: float) -> bool:
        """Whether half or more of the peers have a scrape overdue too: then the stall is ours (the
        event loop was blocked) or the whole fleet's, and ejecting one endpoint would be wrong."""
        pol = self.policy
        peers = stuck = 0
        for m in self._members:
            if m is health:
                continue
            peers += 1
            s = m.scrape_in_flight
            if s and now - s > max(pol.scrape_hang_time, pol.scrape_slow_factor * m.scrape_usual):
                stuck += 1
        return peers > 0 and 2 * stuck >= peers

    def peer_medians(self, health: EndpointHealth) -> tuple[float, float, float]:
        """The medians over the other endpoints of their time to first token per queued request,
        time to response headers and load, each over those that have a sample (else 0.0).

        The latency's is the upper median: with two peers, the slower of them.  A peer's figure
        is its last samples', however old: one that routing has left alone since it got busy
        keeps the figure it had then, and the mean of that and one live peer's would make the
        reference what no peer takes now.
        """
        latency: list[float] = []
        headers: list[float] = []
        load: list[float] = []
        for m in self._members:
            if m is health:
                continue
            if m.latency_usual:
                latency.append(m.latency_usual)
                load.append(m.load_usual)
            if m.headers_usual:
                headers.append(m.headers_usual)
        return _median(latency, upper=True), _median(headers), _median(load)

    # --- reporting -------------------------------------------------------------------------------
    def transition(self, health: EndpointHealth, old: Status, reason: str) -> None:
        """One log line and the metrics for a state change (rare: never per request)."""
        new = health.status
        HEALTH_TRANSITIONS.labels(health.name, new.name.lower(), reason).inc()
        if health in self._members:
            HEALTH_STATE.labels(health.name).set(int(new))
        event = log.warning if new > old and new is not PROBING else log.info
        event(
            "endpoint_health",
            endpoint=health.name,
            state=new.name.lower(),
            previous=old.name.lower(),
            reason=reason,
            ejections=health.ejections,
        )
        if new is EJECTED and self.on_eject is not None:
            self.on_eject(health)


HEALTH: Final = HealthPool()
