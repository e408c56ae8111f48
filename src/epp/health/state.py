"""One endpoint's health: the signals every layer reports, and the state machine they drive.

States, from best to worst (``Status``):

* ``HEALTHY``: scored and picked as usual.
* ``DEGRADED``: penalised (``endpoint-health-scorer`` scores it 0) but still a candidate, so it
  serves when it is the best; a time-to-first-token outlier lands here, and so does an endpoint
  the ejection budget (``maxEjectionPercent``) does not let go.
* ``PROBING``: back from an ejection or a penalty: a candidate for one request at a time until one
  succeeds (then ``HEALTHY``) or fails (ejected or penalised again, for twice as long).
* ``EJECTED``: not a candidate until ``ejected_until`` (or until it shows it is alive again).
* ``UNREACHABLE``: its scrape was refused: a crashed replica, out until a scrape succeeds.

The signals and what they do are in docs/health.md; thresholds are the pool's ``HealthPolicy``.
Requests read ``available`` for every candidate, so its common case is a status check and one
timestamp comparison; everything else happens on the rare paths.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from epp.health.pool import HealthPool


class Status(IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    PROBING = 2
    EJECTED = 3
    UNREACHABLE = 4


HEALTHY: Final = Status.HEALTHY
DEGRADED: Final = Status.DEGRADED
PROBING: Final = Status.PROBING
EJECTED: Final = Status.EJECTED
UNREACHABLE: Final = Status.UNREACHABLE

# Scrape outcomes, as the data layer reports them.
SCRAPE_OK: Final = "ok"
SCRAPE_REFUSED: Final = "refused"  # connection refused or reset: nothing listens
SCRAPE_TIMEOUT: Final = "timeout"  # the poll deadline passed
SCRAPE_ERROR: Final = "error"  # an HTTP error status or bad exposition: alive, so not a health signal

# Reasons, as logged and as the metric's ``reason`` label.
CONNECTION_REFUSED: Final = "connection-refused"
SCRAPE_HANG: Final = "scrape-hang"
NO_RESPONSE_HEADERS: Final = "no-response-headers"
CONSECUTIVE_5XX: Final = "consecutive-5xx"
CONSECUTIVE_GATEWAY_FAILURE: Final = "consecutive-gateway-failure"
LATENCY_OUTLIER: Final = "latency-outlier"
EJECTION_BUDGET: Final = "max-ejection-percent"
EJECTION_EXPIRED: Final = "ejection-expired"
PENALTY_EXPIRED: Final = "penalty-expired"
PROBE_SUCCEEDED: Final = "probe-succeeded"
SCRAPE_SUCCEEDED: Final = "scrape-succeeded"
RESPONDED: Final = "responded"

RECHECK: Final = 0.005  # seconds between looks at a healthy endpoint whose requests wait long
_EWMA: Final = 0.3  # weight of a new time-to-first-token or time-to-headers sample
SIMILAR_LOAD: Final = (2.0, 4.0)  # comparable: load (waiting + running) <= 2 x the peers' median + 4
_SCRAPE_EWMA: Final = 0.1  # weight of a new scrape duration: the endpoint's own usual moves slowly


class EndpointHealth:
    """The health of one endpoint.  Signals in (``scrape_*``, ``sent``, ``headers``, ``first_byte``,
    ``ended``), verdicts out (``available``, ``score``); the policy and the peers are the pool's."""

    __slots__ = (
        "awaiting",
        "consecutive_5xx",
        "consecutive_gateway",
        "ejected_until",
        "ejections",
        "headers_usual",
        "latency_samples",
        "latency_streak",
        "latency_streak_since",
        "latency_usual",
        "load_usual",
        "name",
        "penalties",
        "penalty_until",
        "pool",
        "probe_for",
        "probe_pending",
        "quiet_until",
        "reason",
        "refs",
        "refs_at",
        "scrape_in_flight",
        "scrape_timeouts",
        "scrape_usual",
        "since",
        "status",
        "waiting_since",
    )

    def __init__(self, name: str = "", pool: HealthPool | None = None) -> None:
        if pool is None:
            from epp.health.pool import HEALTH  # the process's owner, unless a test brings its own

            pool = HEALTH
        self.pool = pool
        self.name = name
        self.status = HEALTHY
        self.reason = ""
        self.since = 0.0
        self.ejected_until = 0.0
        self.ejections = 0
        self.penalty_until = 0.0
        self.penalties = 0
        self.consecutive_5xx = 0
        self.consecutive_gateway = 0
        self.scrape_in_flight = 0.0  # when the scrape in flight started; 0.0: none
        self.scrape_usual = 0.0  # EWMA of successful scrape durations
        self.scrape_timeouts = 0  # in a row
        self.awaiting = 0  # requests routed here still without response headers
        self.waiting_since = 0.0  # since when those have waited with no response headers at all
        self.quiet_until = math.inf  # before this, ``available`` needs no look (see requiet)
        self.probe_pending = False
        self.probe_for = ""  # the reason of the ejection or penalty being probed
        self.headers_usual = 0.0  # EWMA of seconds from a request's arrival to its response headers
        self.latency_usual = 0.0  # EWMA of time to first token per queued request ahead (+1)
        self.latency_samples = 0
        self.latency_streak = 0  # judged samples in a row, up to now, over the outlier threshold
        self.latency_streak_since = 0.0  # when the first of them came
        self.load_usual = 0.0  # EWMA of waiting + running requests at its first bytes
        self.refs = (0.0, 0.0, 0.0)  # the peers' medians of latency_usual, headers_usual, load_usual
        self.refs_at = -math.inf

    # --- verdicts --------------------------------------------------------------------------
    def available(self, now: float) -> bool:
        """Whether a request may go here now (a candidate); the scheduler still scores it.

        Called for every candidate of every request: the common case is one comparison with
        ``quiet_until``, before which a healthy endpoint needs no look (``requiet``).
        """
        if now <= self.quiet_until:
            return True
        return self._check(now)

    def requiet(self) -> None:
        """``quiet_until``: never for a healthy endpoint nobody waits on; for one with requests
        waiting, until they have waited ``pool.watch``; for any other state, no quiet at all."""
        if self.status is not HEALTHY:
            self.quiet_until = -math.inf
        elif self.waiting_since:
            self.quiet_until = self.waiting_since + self.pool.watch
        else:
            self.quiet_until = math.inf

    def score(self) -> float:
        """The penalty as a score in [0, 1]: 0 while degraded, else 1."""
        return 0.0 if self.status is DEGRADED else 1.0

    @property
    def unreachable(self) -> bool:
        return self.status is UNREACHABLE

    # --- signals: the data layer -------------------------------------------------------------
    def scrape_started(self, now: float) -> None:
        self.scrape_in_flight = now

    def scrape_ended(self, outcome: str, now: float) -> None:
        """A scrape finished with ``outcome`` (``SCRAPE_*``)."""
        started, self.scrape_in_flight = self.scrape_in_flight, 0.0
        if outcome == SCRAPE_OK:
            self.scrape_timeouts = 0
            if started:
                took = now - started
                usual = self.scrape_usual
                self.scrape_usual = took if not usual else usual + _SCRAPE_EWMA * (took - usual)
            if self.status is UNREACHABLE:
                self._set(HEALTHY, SCRAPE_SUCCEEDED, now)
            elif self.status is EJECTED and self.reason == SCRAPE_HANG:
                self._probe(SCRAPE_SUCCEEDED, now)  # it answers again: try it, one request first
        elif outcome == SCRAPE_REFUSED:
            if self.status is not UNREACHABLE:
                self.probe_pending = False
                self._set(UNREACHABLE, CONNECTION_REFUSED, now)
        elif outcome == SCRAPE_TIMEOUT:
            self.scrape_timeouts += 1

    # --- signals: the director ---------------------------------------------------------------
    def sent(self, now: float) -> None:
        """A request was routed here."""
        if not self.awaiting:
            self.waiting_since = now
            self.requiet()
        self.awaiting += 1
        if self.status is PROBING:
            self.probe_pending = True

    def headers(self, status: int, elapsed: float, now: float) -> None:
        """Response headers with ``status`` arrived ``elapsed`` seconds after the request did."""
        if self.awaiting:
            self.awaiting -= 1
            self.waiting_since = now if self.awaiting else 0.0
            self.requiet()
        if status >= 500:
            self._failed(status, now)
            return
        usual = self.headers_usual
        self.headers_usual = elapsed if not usual else usual + _EWMA * (elapsed - usual)
        self.consecutive_5xx = self.consecutive_gateway = 0
        st = self.status
        if st is HEALTHY:
            self.ejections = 0
        elif st is PROBING and self.probe_for != LATENCY_OUTLIER:
            self._set(HEALTHY, PROBE_SUCCEEDED, now)
        elif st is EJECTED and self.reason in (SCRAPE_HANG, NO_RESPONSE_HEADERS):
            self._probe(RESPONDED, now)  # a hung endpoint that answers again is not hung

    def first_byte(self, ttft: float, waiting: int, running: int, streaming: bool, now: float) -> None:
        """The first response body bytes, ``ttft`` seconds after the request arrived, at the load
        the endpoint last reported (``waiting`` and ``running`` requests).  Only streamed responses
        measure the time to first token; a non-streamed one only settles a probe.

        Load makes an endpoint slow as surely as a fault does, so only comparable samples are
        judged: the time per queued request ahead (a queued request delays a new one by about
        one request's time), and only while the endpoint is not far busier than its peers
        (``SIMILAR_LOAD``): a saturated replica is slow because it is busy, which the load
        scorers already see.

        A slow moment is not a slow replica: a replica's process stalled for a moment (a
        garbage collection, a noisy neighbour on its node) delays every request in flight
        there, so they all come late together, and against peers whose first tokens take a few
        milliseconds one of them alone would triple the average.  A penalty needs
        ``latencyConsecutiveOutliers`` slow samples in a row, the last of them from a request
        that arrived after the first of them came (slow for new requests too, not only those a
        stall caught), as well as a slow average.
        """
        st = self.status
        if not streaming:
            if st is PROBING and self.probe_pending:
                self._set(HEALTHY, PROBE_SUCCEEDED, now)
            return
        x = ttft / (1.0 + waiting)
        load = float(waiting + running)
        self.load_usual = load if not self.load_usual else self.load_usual + _EWMA * (load - self.load_usual)
        pol = self.pool.policy
        probe = st is PROBING and self.probe_pending
        usual = self.latency_usual
        self.latency_usual = x if not usual else usual + _EWMA * (x - usual)
        self.latency_samples += 1
        ref, _, peer_load = self._refs(now)
        if load > SIMILAR_LOAD[0] * peer_load + SIMILAR_LOAD[1]:
            ref = 0.0  # far busier than its peers: its time says nothing about its health
        slow = ref > 0.0 and x > pol.latency_outlier_factor * ref
        if not slow:
            self.latency_streak = 0
        elif not self.latency_streak:
            self.latency_streak, self.latency_streak_since = 1, now
        else:
            self.latency_streak += 1
        if probe:  # the probe is one request, sent to decide: it is judged alone
            if slow:
                self._penalise(now)
            else:
                self.penalties = 0
                self._set(HEALTHY, PROBE_SUCCEEDED, now)
        elif (
            st is HEALTHY
            and slow
            and self.latency_streak >= pol.latency_consecutive_outliers
            and now - ttft > self.latency_streak_since  # it arrived after the streak began
            and self.latency_samples >= pol.latency_min_samples
            and self.latency_usual > pol.latency_outlier_factor * ref
        ):
            self._penalise(now)

    def ended(self, got_headers: bool, now: float) -> None:
        """A request routed here is over (``got_headers``: its response headers came)."""
        if not got_headers and self.awaiting:
            self.awaiting -= 1
            if not self.awaiting:
                self.waiting_since = 0.0
                self.requiet()
        self.probe_pending = False

    # --- membership ----------------------------------------------------------------------------
    def join(self) -> None:
        """Count this endpoint in its pool (peers, ejection budget): the data layer does, per endpoint."""
        self.pool.join(self)

    def leave(self) -> None:
        self.pool.leave(self)

    # --- the state machine ---------------------------------------------------------------------
    def _check(self, now: float) -> bool:
        st = self.status
        if st is UNREACHABLE:
            return False
        if st is EJECTED:
            if now < self.ejected_until:
                return False
            self._probe(EJECTION_EXPIRED, now)
        elif st is DEGRADED and now >= self.penalty_until and self.probe_for == LATENCY_OUTLIER:
            self.latency_usual = 0.0
            self.latency_samples = self.latency_streak = 0
            self._probe(PENALTY_EXPIRED, now)
        elif st is DEGRADED and now >= self.penalty_until:
            self._set(HEALTHY, PENALTY_EXPIRED, now)
        w = self.waiting_since
        if w and self.status is not EJECTED:
            self._stalled(now - w, now)
        st = self.status
        if st is HEALTHY:  # looked, nothing wrong: the next look in RECHECK, not per request
            self.quiet_until = now + RECHECK
            return True
        if st is EJECTED:
            return False
        return not (st is PROBING and self.probe_pending)

    def _stalled(self, waited: float, now: float) -> None:
        """Requests here have waited ``waited`` seconds with no response headers: hung?"""
        pol = self.pool.policy
        hang = max(pol.scrape_hang_time, pol.scrape_slow_factor * self.scrape_usual)
        s = self.scrape_in_flight
        if s and now - s > hang and waited > hang:
            if not self.pool.peers_stuck(self, now):
                self._eject(SCRAPE_HANG, now)
            return
        if waited <= pol.no_headers_time:
            return
        ref = self._refs(now)[1]
        stalled = ref and waited > max(pol.no_headers_time, pol.no_headers_factor * ref)
        if stalled and not self.pool.peers_stuck(self, now):
            self._eject(NO_RESPONSE_HEADERS, now)

    def _failed(self, status: int, now: float) -> None:
        pol = self.pool.policy
        self.consecutive_5xx += 1
        gateway = status in (502, 503, 504)
        self.consecutive_gateway = self.consecutive_gateway + 1 if gateway else 0
        st = self.status
        if st is EJECTED or st is UNREACHABLE:
            return
        reason = CONSECUTIVE_GATEWAY_FAILURE if gateway else CONSECUTIVE_5XX
        if st is PROBING and self.probe_for != LATENCY_OUTLIER:
            self._eject(reason, now)  # the probe failed
        elif self.consecutive_5xx >= pol.consecutive_5xx:
            self._eject(CONSECUTIVE_5XX, now)
        elif gateway and self.consecutive_gateway >= pol.consecutive_gateway_failure:
            self._eject(CONSECUTIVE_GATEWAY_FAILURE, now)

    def _eject(self, reason: str, now: float) -> None:
        pol = self.pool.policy
        self.consecutive_5xx = self.consecutive_gateway = 0
        self.probe_pending = False
        if not self.pool.ejection_allowed(self, now):
            if self.status is not DEGRADED:  # over the budget: penalise instead
                self.probe_for = reason
                self.penalty_until = now + pol.base_ejection_time
                self._set(DEGRADED, f"{EJECTION_BUDGET}:{reason}", now)
            return
        self.ejections += 1
        self.ejected_until = now + min(
            pol.max_ejection_time, pol.base_ejection_time * 2.0 ** (self.ejections - 1)
        )
        self.probe_for = reason
        self._set(EJECTED, reason, now)

    def adopt_ejection(self, reason: str, seconds: float, ejections: int, now: float) -> bool:
        """Another worker of this pod (or a peer replica) ejected this endpoint for ``seconds``
        more, its ``ejections``-th time: eject it here too, as if this process had seen the failure,
        so its probe and backoff follow.  Not when it is out already or the ejection budget does
        not allow one more (each process keeps its own budget)."""
        if self.status is EJECTED or self.status is UNREACHABLE or seconds <= 0:
            return False
        if not self.pool.ejection_allowed(self, now):
            return False
        self.consecutive_5xx = self.consecutive_gateway = 0
        self.probe_pending = False
        self.ejections = max(self.ejections, ejections)
        self.ejected_until = now + seconds
        self.probe_for = reason
        self._set(EJECTED, reason, now)
        return True

    def _penalise(self, now: float) -> None:
        pol = self.pool.policy
        self.penalties += 1
        self.penalty_until = now + min(
            pol.max_penalty_time, pol.base_penalty_time * 2.0 ** (self.penalties - 1)
        )
        self.probe_for = LATENCY_OUTLIER
        self.probe_pending = False
        self._set(DEGRADED, LATENCY_OUTLIER, now)

    def _probe(self, reason: str, now: float) -> None:
        self.probe_pending = False
        self._set(PROBING, reason, now)

    def _set(self, status: Status, reason: str, now: float) -> None:
        old = self.status
        self.status = status
        self.reason = reason
        self.since = now
        self.requiet()
        self.pool.transition(self, old, reason)

    def _refs(self, now: float) -> tuple[float, float, float]:
        """The peers' medians of (time to first token per queued request, time to
        headers, load)."""
        if now - self.refs_at > self.pool.refs_ttl:
            self.refs = self.pool.peer_medians(self)
            self.refs_at = now
        return self.refs

    # --- introspection ---------------------------------------------------------------------------
    def debug_state(self, now: float) -> dict[str, Any]:
        """For ``/debug/plugins/state`` and ``epp explain``: plain JSON types."""
        lat_ref, hdr_ref, load_ref = self.refs
        return {
            "status": self.status.name.lower(),
            "reason": self.reason,
            "available": self.available(now),
            "score": self.score(),
            "forSeconds": round(now - self.since, 3) if self.since else None,
            "ejectedForSeconds": round(max(0.0, self.ejected_until - now), 3),
            "ejections": self.ejections,
            "penalisedForSeconds": round(max(0.0, self.penalty_until - now), 3)
            if self.status is DEGRADED
            else 0.0,
            "consecutive5xx": self.consecutive_5xx,
            "awaitingHeaders": self.awaiting,
            "waitingSeconds": round(now - self.waiting_since, 3) if self.waiting_since else 0.0,
            "scrapeUsualMs": round(self.scrape_usual * 1000, 2),
            "scrapeInFlightMs": round((now - self.scrape_in_flight) * 1000, 1)
            if self.scrape_in_flight
            else 0.0,
            "scrapeTimeouts": self.scrape_timeouts,
            "ttftPerQueueMs": round(self.latency_usual * 1000, 2),
            "load": round(self.load_usual, 1),
            "peersLoad": round(load_ref, 1),
            "peersTtftPerQueueMs": round(lat_ref * 1000, 2),
            "headersMs": round(self.headers_usual * 1000, 2),
            "peersHeadersMs": round(hdr_ref * 1000, 2),
        }
