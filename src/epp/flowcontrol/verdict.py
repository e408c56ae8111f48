"""What a saturation detector says about the pool, per P/D stage.

One reading for both users: the flow controller gates dispatch on ``effective`` (and sets the
per-stage gauges from it), and ``/debug/plugins/state`` shows it on demand.  Nothing here has
side effects beyond what the detector's ``saturation`` has (none for the built-ins, apart from
the utilization detector's rate-limited "all metrics stale" warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.datalayer import roles
from epp.datalayer.api import Endpoint
from epp.flowcontrol.api import SaturationDetector


@dataclass(frozen=True, slots=True)
class StageSaturation:
    """llm-d-router's P/D reading: each stage apart (None when the stage has no endpoint), and
    the effective saturation, their maximum (the whole pool's when both stages are empty)."""

    prefill: float | None
    decode: float | None
    effective: float


def stage_saturation(
    detector: SaturationDetector,
    endpoints: Sequence[Endpoint],
    stages: tuple[Sequence[Endpoint], Sequence[Endpoint]],
) -> StageSaturation:
    """``stages`` is ``roles.partition(endpoints)`` when it split the pool."""
    prefill_eps, decode_eps = stages
    prefill = detector.saturation(prefill_eps) if prefill_eps else None
    decode = detector.saturation(decode_eps) if decode_eps else None
    effective = max((s for s in (prefill, decode) if s is not None), default=None)
    if effective is None:
        effective = detector.saturation(endpoints)
    return StageSaturation(prefill, decode, effective)


def verdict(detector: SaturationDetector, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The detector's reading of ``endpoints`` as JSON: ``saturation`` (effective under a P/D
    split, as flow control reads it), ``saturated`` (>= 1.0, the detector's own saturation
    point, where legacy admission sheds), and ``stages`` (None without a prefill role)."""
    stages = roles.partition(endpoints)
    if stages is None:
        saturation = detector.saturation(endpoints)
        per_stage = None
    else:
        s = stage_saturation(detector, endpoints, stages)
        saturation = s.effective
        per_stage = {"prefill": s.prefill, "decode": s.decode, "effective": s.effective}
    return {
        "type": detector.typed_name.type,
        "saturation": saturation,
        "saturated": saturation >= 1.0,
        "stages": per_stage,
    }
