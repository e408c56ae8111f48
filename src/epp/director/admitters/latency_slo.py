"""``latency-slo-admitter``: refuse sheddable requests that no endpoint can serve within their SLO."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION
from epp.director.latency.slo import SLO_TPOT_HEADER, SLO_TTFT_HEADER, slo_ms
from epp.plugin.base import PluginBase
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

COLD_KV: Final = 0.02  # an endpoint below this KV-cache use is "cold": it can take anything


class LatencySloAdmitter(PluginBase):
    """Shed what cannot meet its SLO.  Type ``latency-slo-admitter`` (no parameters).

    Applies only to sheddable requests (priority < 0) carrying an SLO header
    (``x-slo-ttft-ms`` or ``x-slo-tpot-ms``) > 0, and only when predictions were made.  The
    request is denied when no candidate is predicted to meet it (a valid prediction with
    headroom ≥ 0 on every dimension that has an SLO), none is idle (no running request
    in its last scrape) and none is cold (KV-cache use < 0.02): an idle or cold endpoint
    may serve it even if the model disagrees, which also keeps the model learning.
    A denial returns the reason; the director answers 500 ``request cannot be admitted``
    (GIE §3.1 step 8) and logs the reason.
    Consumes ``LATENCY_PREDICTION``.
    """

    TYPE: ClassVar[str] = "latency-slo-admitter"
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({LATENCY_PREDICTION})

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> str | None:
        if request.priority >= 0:
            return None
        headers = request.headers
        slo_ttft, slo_tpot = slo_ms(headers, SLO_TTFT_HEADER), slo_ms(headers, SLO_TPOT_HEADER)
        if slo_ttft <= 0 and slo_tpot <= 0:
            return None
        infos = state.attributes(LATENCY_PREDICTION)
        if not infos:
            return None
        best_ttft = best_tpot = float("inf")
        for ep in endpoints:
            m = ep.metrics
            if m.running_requests_size == 0 or m.kv_cache_usage_percent < COLD_KV:
                return None
            info = infos.get(ep)
            if info is None:
                continue
            ttft_ok = slo_ttft <= 0 or (info.ttft_valid and info.ttft_headroom >= 0)
            tpot_ok = slo_tpot <= 0 or (info.tpot_valid and info.tpot_headroom >= 0)
            if ttft_ok and tpot_ok:
                return None
            if info.ttft_valid:
                best_ttft = min(best_ttft, info.ttft)
            if info.tpot_valid:
                best_tpot = min(best_tpot, info.tpot)
        return (
            f"no endpoint can serve sheddable request within its SLO "
            f"(ttft slo {slo_ttft:g} ms, best predicted {best_ttft:.1f} ms; "
            f"tpot slo {slo_tpot:g} ms, best predicted {best_tpot:.1f} ms); none is idle or cold"
        )
