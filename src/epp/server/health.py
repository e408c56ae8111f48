"""gRPC health (GIE §9.3): SERVING once the pool is synced, the parser fits it, and we lead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

EXT_PROC_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS: Final = "liveness"
READINESS: Final = "readiness"

SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: Final = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers from live state rather than a table set at startup.

    ``ready()`` combines "pool synced" and "parser supports the pool's appProtocol"; it
    also turns false while the server drains, so Envoy's health check moves traffic away
    before the process exits.  With leader election: ``readiness``, ``""`` and the
    ext_proc service also need ``leader()``; ``liveness`` is always SERVING; any other
    name is SERVICE_UNKNOWN.  Without it every name gets the readiness answer.
    """

    def __init__(
        self,
        ready: Callable[[], bool],
        *,
        leader_election: bool = False,
        leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self._ready = ready
        self._leader_election = leader_election
        self._leader = leader

    def status(self, service: str) -> Any:
        if not self._leader_election:
            return SERVING if self._ready() else NOT_SERVING
        if service == LIVENESS:
            return SERVING
        if service in (READINESS, "", EXT_PROC_SERVICE):
            return SERVING if self._ready() and self._leader() else NOT_SERVING
        return SERVICE_UNKNOWN

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        names = [EXT_PROC_SERVICE, LIVENESS, READINESS] if self._leader_election else [EXT_PROC_SERVICE]
        resp = health_pb2.HealthListResponse()
        for name in names:
            resp.statuses[name].status = self.status(name)
        return resp

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")


def add_to_server(servicer: HealthServicer, server: grpc.aio.Server) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
