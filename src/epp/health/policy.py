"""The health policy: thresholds and actions, named after Envoy's outlier detection where one fits.

Envoy's ``outlier_detection`` is the anchor (consecutive_5xx, consecutive_gateway_failure,
base_ejection_time, max_ejection_time, max_ejection_percent, healthy_panic_threshold); the
fields Envoy has no word for cover what only an EPP sees: scrapes that never finish, requests
left without response headers, and time to first token against the endpoint's peers.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BeforeValidator, Field, model_validator

from epp.plugin.base import PluginParams

_DURATION_RE: Final = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(value: object) -> object:
    """Go duration text (``"150ms"``) to seconds; numbers pass through as seconds."""
    if not isinstance(value, str):
        return value
    text, pos, total = value.strip(), 0, 0.0
    for m in _DURATION_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f'time: invalid duration "{value}"')
    return total


Seconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0)]


class HealthPolicy(PluginParams):
    """What counts as failing, and what is done about it (defaults: docs/health.md)."""

    # Envoy's names.  Hard evidence ejects; a 5xx answer is hard evidence after a streak.
    consecutive_5xx: int = Field(default=3, ge=1, alias="consecutive5xx")
    consecutive_gateway_failure: int = Field(default=2, ge=1)  # 502/503/504: Envoy could not reach it
    base_ejection_time: Seconds = 10.0  # Envoy: 30s; a replica that recovers should not wait that long
    max_ejection_time: Seconds = 300.0
    max_ejection_percent: float = Field(default=50.0, ge=0, le=100)  # at least one endpoint, as in Envoy
    healthy_panic_threshold: float = Field(default=0.0, ge=0, le=100)  # below this share available: use all
    # A hung endpoint: a scrape outstanding ``scrapeHangTime`` and ``scrapeSlowFactor`` times its own
    # usual, while requests routed to it have had no response headers for as long.
    scrape_hang_time: Seconds = 0.15
    scrape_slow_factor: float = Field(default=5.0, ge=1)
    # Requests routed to it got no response headers for ``noHeadersTime`` and ``noHeadersFactor``
    # times what its peers usually take (an inference path that hangs while /metrics answers).
    no_headers_time: Seconds = 0.5
    no_headers_factor: float = Field(default=10.0, ge=1)
    # Time to first token (per unit of queue) against the peers' median: at ``latencyOutlierFactor``
    # times it the endpoint is penalised for ``basePenaltyTime`` (doubling while it stays slow, up
    # to ``maxPenaltyTime``), then probed with one request.  Only after ``latencyConsecutiveOutliers``
    # slow samples in a row, the last from a request sent after the first came: a stalled moment of
    # the replica's process, which delays the requests in flight together, is not a slow replica.
    latency_outlier_factor: float = Field(default=3.0, gt=1)
    latency_min_samples: int = Field(default=2, ge=1)
    latency_consecutive_outliers: int = Field(default=3, ge=1)
    base_penalty_time: Seconds = 2.0  # each probe of a still-slow endpoint costs one slow request
    max_penalty_time: Seconds = 8.0

    @model_validator(mode="after")
    def _ordered(self) -> HealthPolicy:
        if self.max_ejection_time < self.base_ejection_time:
            raise ValueError("maxEjectionTime must not be below baseEjectionTime")
        if self.max_penalty_time < self.base_penalty_time:
            raise ValueError("maxPenaltyTime must not be below basePenaltyTime")
        return self


DEFAULT_POLICY: Final = HealthPolicy()
