"""The per-request latency SLOs of GIE's predictor family, read once for the producer and the
admitter so both see the same SLO for the same header."""

from __future__ import annotations

import math
from collections.abc import Mapping

from epp.request import SLO_TPOT_HEADER, SLO_TTFT_HEADER, control_header

__all__ = ["SLO_TPOT_HEADER", "SLO_TTFT_HEADER", "slo_ms"]


def slo_ms(headers: Mapping[str, str], name: str) -> float:
    """An SLO header in ms (by llm-d's name or GIE's); 0 (no SLO) when absent or not a
    positive finite number."""
    raw = control_header(headers, name)
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if value > 0 and math.isfinite(value) else 0.0
