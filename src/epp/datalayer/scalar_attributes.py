"""Numeric endpoint attributes named by key: what llm-d-router's endpoint-attribute plugins read.

Upstream stores them in each endpoint's attribute map under a data key
``"<attribute>/<producer>"`` (e.g. ``GPUUtilization/dcgm-extractor``).  Here the producer keeps
its values (one dict per key, mutated in place, never replaced) and the readers find that dict
once, through the plugin handle: a request then costs one dict lookup per candidate and the
``Endpoint`` stays the same slotted object.  A producer drops an endpoint's value when the
endpoint leaves the datastore (it is an ``EndpointObserver``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol, runtime_checkable

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle

_NONE: Final[Mapping[Endpoint, float]] = {}
_UNRESOLVED: Any = object()


def data_key(attribute: str, producer: str | None) -> str:
    """The key a reader's ``attribute`` (and optional ``producer``) names.

    With ``producer`` omitted the attribute is the key as written: llm-d-router v0.10's single
    ``"Attribute/Producer"`` spelling.  Later releases split the two; both spellings name the
    same key here.
    """
    if not producer:
        return attribute
    return f"{attribute}/{producer}"


@runtime_checkable
class ScalarAttributeProducer(Protocol):
    """A plugin that publishes numeric endpoint attributes."""

    def scalar_values(self, key: str) -> Mapping[Endpoint, float] | None:
        """The live values of ``key`` by endpoint, or None if this plugin does not produce it."""
        ...


class ScalarAttributeRef:
    """The values of one key, found among the plugins on first use.

    Looked up lazily because plugins are built in config order and the producer may come
    later.  No producer means every endpoint lacks the attribute (upstream's optional
    dependency: the reader's missing-value policy applies).
    """

    __slots__ = ("_handle", "_values", "key")

    def __init__(self, handle: Handle, key: str) -> None:
        self._handle = handle
        self.key = key
        self._values: Mapping[Endpoint, float] = _UNRESOLVED

    def values(self) -> Mapping[Endpoint, float]:
        found = self._values
        if found is _UNRESOLVED:
            found = _NONE
            for plugin in self._handle.plugins():
                if isinstance(plugin, ScalarAttributeProducer):
                    values = plugin.scalar_values(self.key)
                    if values is not None:
                        found = values
                        break
            self._values = found
        return found


# A cluster-endpoint's pool aggregates (llm-d-router's multicluster family): written by
# ``multicluster-metrics-extractor``, read by the multicluster scorers.  Upstream addresses them
# with no producer (any extractor that supplies the aggregate will do), so the key is the name.
MULTICLUSTER_KV_CACHE_UTILIZATION_KEY: Final = "llm-d.ai/multicluster-kv-cache-utilization"
MULTICLUSTER_QUEUE_SIZE_KEY: Final = "llm-d.ai/multicluster-queue-size"
