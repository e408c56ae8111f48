"""A producer of numeric endpoint attributes for the endpoint-attribute filter's and scorer's tests."""

from __future__ import annotations

from collections.abc import Mapping

from epp.datalayer.api import Endpoint
from epp.plugin.base import TypedName


class AttributeProducer:
    """Publishes fixed values under one key, as a custom-metrics extractor would."""

    def __init__(self, key: str, values: Mapping[Endpoint, float]) -> None:
        self.typed_name = TypedName("test-attribute-producer", "producer")
        self.key = key
        self.values = dict(values)

    def scalar_values(self, key: str) -> Mapping[Endpoint, float] | None:
        return self.values if key == self.key else None
