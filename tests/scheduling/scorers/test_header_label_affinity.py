"""header-label-affinity-scorer: 1 where the endpoint's label equals the request header."""

from __future__ import annotations

import pytest

from epp.plugin.state import CycleState
from epp.scheduling.scorers.header_label_affinity import HeaderLabelAffinityScorer
from epp.testing.builders import make_endpoint, make_request
from epp.testing.plugins import build


def test_header_label_affinity_scores_matching_label() -> None:
    scorer = build(HeaderLabelAffinityScorer, headerName="X-Tier", labelKey="tier")
    eps = [
        make_endpoint(0, labels={"tier": "gold"}),
        make_endpoint(1, labels={"tier": "bronze"}),
        make_endpoint(2),
    ]
    assert scorer.score(CycleState(), make_request(headers={"x-tier": "gold"}), eps) == [1.0, 0.0, 0.0]
    assert scorer.score(CycleState(), make_request(), eps) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="labelKey"):
        build(HeaderLabelAffinityScorer, headerName="X-Tier", labelKey="")
