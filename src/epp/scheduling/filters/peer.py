"""``exclude-peer-filter``: keep the prefill stage off the pod that decodes (this project's own).

In a fleet of ``llm-d.ai/role: prefill-decode`` pods every pod passes both role filters, so the
prefill profile may pick the very pod the decode profile picked: the request is then sent a
prefill leg to itself and pays a KV "transfer" for nothing.  llm-d-router has no filter for this
(its only reader of ``peer-endpoint`` is ``topology-affinity-filter``, which keeps pods *near*
the peer).  This filter drops the ``peer-endpoint`` that ``disagg-profile-handler`` publishes
before the second stage runs; put it in the prefill profile (decode-first) after the role
filter.  Without a peer in the cycle state (the first stage, or another handler) it keeps every
candidate.  It never fails open: if the peer was the only candidate nothing is left, and the
handler fails the request closed (503 ``prefill_unavailable``), as for any empty prefill profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.profiles.disagg import PEER_ENDPOINT


class ExcludePeerFilter(PluginBase):
    """Drop the ``peer-endpoint`` (the other stage's pick).  Type ``exclude-peer-filter``.

    An endpoint is the peer when its ``ip:port`` is the peer's.  Parameters: none.
    """

    TYPE: ClassVar[str] = "exclude-peer-filter"

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        peer = state.get(PEER_ENDPOINT)
        if peer is None:
            return endpoints
        hostport = peer.hostport
        return [ep for ep in endpoints if ep.hostport != hostport]
