"""``kv-events-source``: the engines' KV-cache events as a data-layer source.

The data layer starts it and tells it which endpoints exist; it keeps one ZMQ SUB per endpoint
and the block index they feed (``epp.datalayer.kvevents``).  A ``precise-prefix-cache-scorer``
with ``kvEventsSource: <this plugin's name>`` reads that index instead of subscribing itself, so
the subscription is wired where the other data sources are (``dataLayer.sources``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from epp.datalayer.api import EndpointEvent
from epp.datalayer.kvevents.config import KVEventsConfig, TokenProcessorConfig, build_subscriber
from epp.datalayer.kvevents.index import EndpointState
from epp.errors import ConfigError
from epp.plugin.base import Handle, Plugin, PluginBase, PluginParams


class KVEventsSourceParams(PluginParams):
    token_processor_config: TokenProcessorConfig = Field(default_factory=TokenProcessorConfig)
    kv_events_config: KVEventsConfig = Field(default_factory=KVEventsConfig)
    lru_capacity_per_server: int = 31250


class KVEventsSource(PluginBase):
    """Subscribes to every endpoint's KV events.  Type ``kv-events-source``.

    Output: per-endpoint ``EndpointState`` (no extractors: the index is read by the scorer).
    Parameters: ``tokenProcessorConfig`` (blockSize, hashSeed, hashAlgo: what the events must
    match), ``kvEventsConfig`` (as the scorer's), ``lruCapacityPerServer``.
    """

    TYPE: ClassVar[str] = "kv-events-source"
    PARAMS: ClassVar[type[PluginParams]] = KVEventsSourceParams
    OUTPUT: ClassVar[type[EndpointState]] = EndpointState

    def __init__(self, name: str, params: KVEventsSourceParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        _, self.subscriber = build_subscriber(
            self.TYPE, params.token_processor_config, params.kv_events_config, params.lru_capacity_per_server
        )

    def bind(self, extractors: Sequence[Plugin]) -> None:
        if extractors:
            raise ConfigError(f"{self.typed_name} takes no extractors: its index is read by the scorer")

    def endpoint_event(self, event: EndpointEvent) -> None:
        if event.type == "Delete":
            self.subscriber.remove(event.endpoint)
        else:
            self.subscriber.add(event.endpoint)

    async def start(self) -> None:
        await self.subscriber.start()

    async def stop(self) -> None:
        await self.subscriber.stop()

    def debug_state(self) -> dict[str, Any]:
        return self.subscriber.debug_state()
