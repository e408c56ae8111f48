"""Which endpoints may serve a request: all of them, or Envoy's subset hint (GIE §3.4), then
those worth routing to (fresh metrics, available), each step failing open."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from epp.datalayer.api import Endpoint

SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"


def _host(hostport: str) -> str:
    """Strip ``:port`` after the last colon, and IPv6 brackets."""
    host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def locate(
    endpoints: Sequence[Endpoint], metadata: Mapping[str, Any], *, subset_filter: bool = True
) -> Sequence[Endpoint]:
    """The candidates for a request.

    Without a hint (or with ``--disable-endpoint-subset-filter``) every endpoint is a
    candidate.  A present but empty hint means none is.  Hint entries are ``ip:port``
    strings; as in GIE, only the IP is compared, so every rank of a pod matches.
    """
    if not subset_filter:
        return endpoints
    ns = metadata.get(SUBSET_NAMESPACE)
    if ns is None or not isinstance(ns, Mapping):  # None first: an ABC's isinstance costs ~2k
        return endpoints
    subset = ns.get(SUBSET_KEY)
    if not isinstance(subset, (list, tuple)):
        return endpoints
    if not subset:
        return ()
    hosts = {_host(s) for s in subset if isinstance(s, str)}
    return [ep for ep in endpoints if ep.metadata.address in hosts]


def usable(endpoints: Sequence[Endpoint], now: float, staleness_threshold: float) -> Sequence[Endpoint]:
    """The candidates worth scheduling on, in one pass: fresh metrics first, then available.

    Two steps, each failing open (routing somewhere beats refusing): the endpoints with fresh
    metrics, or all when none is (no freshness step when ``staleness_threshold <= 0``); of
    those, the ones their health makes available (``EndpointHealth.available``: not
    unreachable, not ejected, not a probe already in flight), or all of those when none is or
    when fewer than the policy's ``healthyPanicThreshold`` percent are (Envoy's panic mode).
    Penalised endpoints stay: the ``endpoint-health-scorer`` scores them down.  The common case
    (everything fresh and available) returns ``endpoints`` itself, building no list.
    """
    check = staleness_threshold > 0
    i = 0
    for ep in endpoints:
        if check:
            updated = ep.metrics.update_time  # is_stale, inlined
            if updated == 0.0 or now - updated > staleness_threshold:
                break
        health = ep.health  # ``available`` with its quiet window tested here: no call per endpoint
        if now > health.quiet_until and not health.available(now):
            break
        i += 1
    else:
        return endpoints
    fresh = list(endpoints[:i])  # everything before ``i`` is fresh and available
    fresh_available = list(fresh)
    available = list(fresh)
    for ep in endpoints[i:]:
        ok = ep.health.available(now)
        if check:
            updated = ep.metrics.update_time
            if updated == 0.0 or now - updated > staleness_threshold:
                if ok:
                    available.append(ep)
                continue
        fresh.append(ep)
        if ok:
            fresh_available.append(ep)
            available.append(ep)
    pool: Sequence[Endpoint] = endpoints
    kept: Sequence[Endpoint] = available
    if fresh and len(fresh) != len(endpoints):  # the freshness step dropped some, not all
        pool, kept = fresh, fresh_available
    panic = endpoints[0].health.pool.policy.healthy_panic_threshold
    if not kept or (panic and len(kept) * 100.0 < panic * len(pool)):
        kept = pool  # fail open: every endpoint, or every fresh one
    # A subsequence as long as the input is the input: return it, as the two steps did.
    return kept if len(kept) != len(endpoints) else endpoints
