"""Endpoint health: one owner for what every signal says about a model-server endpoint.

The data layer (scrape outcomes and latency), the director (response statuses, requests left
without response headers, time to first token) and the scheduler (the penalty) all talk to the
same ``EndpointHealth`` of each endpoint, whose verdicts follow one ``HealthPolicy`` held by the
``HealthPool``: see docs/health.md.
"""

from epp.health.policy import HealthPolicy
from epp.health.pool import HEALTH, HealthPool
from epp.health.state import EndpointHealth, Status

__all__ = ["HEALTH", "EndpointHealth", "HealthPolicy", "HealthPool", "Status"]
