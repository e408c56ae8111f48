"""``multicluster-session-affinity-filter`` (llm-d-router): session affinity over cluster endpoints."""

from __future__ import annotations

from typing import ClassVar

from epp.scheduling.filters.session_affinity import SessionAffinityFilter


class MultiClusterSessionAffinityFilter(SessionAffinityFilter):
    """``session-affinity-filter`` under the cluster-scoped name.  Type
    ``multicluster-session-affinity-filter``.

    A cluster's identity comes from discovery (``multicluster-file-discovery``), so the stock
    filter already pins a session to its cluster endpoint; same parameters and semantics.
    """

    TYPE: ClassVar[str] = "multicluster-session-affinity-filter"
