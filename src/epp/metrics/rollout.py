"""llm-d-router's ``disaggregatedset-rollout-screener`` families, its names.

``llm_d_epp_disaggregatedset_strict_header_no_match_total{plugin_type, plugin_name, selector}``
counts strict header selections that matched no endpoint (the request failed closed), and
``llm_d_epp_disaggregatedset_revision_gating_share{plugin_type, plugin_name, mode, revision}`` is
the current weighted share (0 to 1) of every observed revision, 0 for one missing a required role;
a revision's series is removed once no endpoint carries it.  GIE has no such families, so they are
native here, not twins (``epp.metrics.llmd``).
"""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Gauge
from epp.metrics.series import REGISTRY

STRICT_HEADER_NO_MATCH: Final = Counter(
    "llm_d_epp_disaggregatedset_strict_header_no_match",
    "[ALPHA] Strict header selections that matched no endpoint and failed closed.",
    ("plugin_type", "plugin_name", "selector"), registry=REGISTRY,
)  # fmt: skip
REVISION_GATING_SHARE: Final = Gauge(
    "llm_d_epp_disaggregatedset_revision_gating_share",
    "[ALPHA] Current weighted revision gating share from 0 to 1; incomplete revisions have share 0.",
    ("plugin_type", "plugin_name", "mode", "revision"), registry=REGISTRY,
)  # fmt: skip
