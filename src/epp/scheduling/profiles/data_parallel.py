"""``data-parallel-profile-handler`` (llm-d-router, deprecated upstream): one port in front of DP ranks.

With vLLM data parallelism behind llm-d's routing sidecar, every rank of a pod is an endpoint
(its own port), but requests must enter through the sidecar on ``primaryPort``; the sidecar
forwards to the rank named in ``x-data-parallel-host-port``.  The handler runs the single
profile, sets that header to the pick, and rewrites the targets' port to ``primaryPort``.
Upstream deprecates it in favour of Istio >= 1.28.1 routing to ranks directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

import structlog
from pydantic import Field

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import HeaderMutation, InferenceRequest
from epp.scheduling.api import ProfileRunResult, SchedulerProfileView, SchedulingResult, only_result

log = structlog.get_logger(__name__)

DATA_PARALLEL_HEADER: Final = "x-data-parallel-host-port"
_MAX_CACHED: Final = 4096


class DataParallelParams(PluginParams):
    primary_port: int = Field(default=8000, ge=0, le=65535)


class DataParallelProfileHandler(PluginBase):
    """Type ``data-parallel-profile-handler``.  Parameters: ``primaryPort`` (8000).

    Exactly one profile (``MAX_PROFILES``).  The result's targets are the picks with their port
    replaced by ``primaryPort`` (0 keeps the port: upstream would send to port 0, where nothing
    listens); ``x-data-parallel-host-port`` carries the first pick's real ``ip:port``.  The
    rewritten endpoints share name, metrics and health with the datastore's, so in-flight
    counting and passive health stay per rank; they are cached per endpoint, not built per request.
    """

    TYPE: ClassVar[str] = "data-parallel-profile-handler"
    PARAMS: ClassVar[type[PluginParams]] = DataParallelParams
    MAX_PROFILES: ClassVar[int | None] = 1

    def __init__(self, name: str, params: DataParallelParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        log.warning("deprecated_plugin_type", plugin=name, type=self.TYPE, use="single-profile-handler")
        self.primary_port = params.primary_port
        self._copies: dict[str, tuple[EndpointMetadata, Endpoint]] = {}

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        if len(profiles) == len(results) or len(profiles) != 1:
            return ()
        return tuple(profiles)

    def _on_primary_port(self, ep: Endpoint) -> Endpoint:
        if not self.primary_port or ep.metadata.port == self.primary_port:
            return ep
        cached = self._copies.get(ep.name)
        if cached is not None and cached[0] is ep.metadata:
            copy = cached[1]
        else:
            if len(self._copies) >= _MAX_CACHED:
                self._copies.clear()
            md = dataclasses.replace(ep.metadata, port=self.primary_port, hostport="")
            copy = Endpoint(md, ep.metrics)
            copy.health = ep.health
            self._copies[ep.name] = (ep.metadata, copy)
        if copy.metrics is not ep.metrics:
            copy.metrics = ep.metrics
        return copy

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        name, result = only_result(results, "data parallel profile handler")
        targets = result.target_endpoints
        if targets:
            request.headers.pop(DATA_PARALLEL_HEADER, None)
            mutation = request.header_mutation
            if mutation is None:
                mutation = request.header_mutation = HeaderMutation()
            if DATA_PARALLEL_HEADER not in mutation.remove:
                mutation.remove.append(DATA_PARALLEL_HEADER)
            mutation.set[DATA_PARALLEL_HEADER] = targets[0].hostport
        rewritten = ProfileRunResult(tuple(self._on_primary_port(ep) for ep in targets), result.scored)
        return SchedulingResult(profile_results={name: rewritten}, primary_profile_name=name)
