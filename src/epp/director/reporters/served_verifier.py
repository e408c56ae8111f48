"""``destination-endpoint-served-verifier``: echo the endpoint Envoy says served the request (conformance)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo

LB_NAMESPACE: Final = "envoy.lb"
SERVED_KEY: Final = "x-gateway-destination-endpoint-served"
RESULT_HEADER: Final = "x-conformance-test-served-endpoint"
MISSING_LB: Final = "fail: missing envoy lb metadata"
MISSING_SERVED: Final = "fail: missing destination endpoint served metadata"


class DestinationEndpointServedVerifier(PluginBase):
    """Report which endpoint the gateway actually used.  Type ``destination-endpoint-served-verifier``.

    On the response headers it sets ``x-conformance-test-served-endpoint`` to the string
    at ``envoy.lb`` / ``x-gateway-destination-endpoint-served`` in the Envoy filter
    metadata of the request (the server refreshes ``request.metadata`` from the
    response-headers message), so the conformance suite can compare it with the pod it
    asked for.  Without the ``envoy.lb`` namespace the header reads
    ``fail: missing envoy lb metadata``; without a string under the key,
    ``fail: missing destination endpoint served metadata``.  A test plugin: it adds one
    header per response and nothing else.
    Consumes: nothing.  Parameters: none.
    """

    TYPE: ClassVar[str] = "destination-endpoint-served-verifier"

    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        lb = request.metadata.get(LB_NAMESPACE)
        if not isinstance(lb, Mapping):
            value = MISSING_LB
        else:
            served = lb.get(SERVED_KEY)
            value = served if isinstance(served, str) else MISSING_SERVED
        response.headers[RESULT_HEADER] = value
