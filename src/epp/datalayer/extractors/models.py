"""``models-data-extractor`` (llm-d-router): the served models of each endpoint, kept per endpoint."""

from __future__ import annotations

from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.served_models import MODELS_ATTRIBUTE_KEY, MODELS_EXTRACTOR_TYPE, ModelData, ModelList
from epp.plugin.base import Handle, PluginBase, PluginParams

_NONE: tuple[ModelData, ...] = ()


class ModelsDataExtractor(PluginBase):
    """Stores each endpoint's ``/v1/models`` list.  Type ``models-data-extractor``.

    Upstream stores the list as the endpoint attribute ``/v1/models`` (producer
    ``models-data-extractor``) on every successful poll, replacing the last one; no in-tree
    plugin of llm-d-router reads it yet.  Here it is kept per endpoint (dropped when the
    endpoint leaves) and readable with ``models(endpoint)``, ``adapters(endpoint)`` (the
    entries with a ``parent``: LoRA adapters) and ``/debug`` state.  No parameters.
    """

    TYPE: ClassVar[str] = MODELS_EXTRACTOR_TYPE
    INPUT: ClassVar[type[ModelList]] = ModelList

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._models: dict[Endpoint, tuple[ModelData, ...]] = {}

    def extract(self, data: ModelList, endpoint: Endpoint) -> None:
        self._models[endpoint] = data.data

    def models(self, endpoint: Endpoint) -> tuple[ModelData, ...]:
        """What the endpoint said it serves at its last successful poll (empty: nothing yet)."""
        return self._models.get(endpoint, _NONE)

    def adapters(self, endpoint: Endpoint) -> tuple[str, ...]:
        """The LoRA adapters among them: the entries that name a ``parent`` model."""
        return tuple(m.id for m in self.models(endpoint) if m.parent)

    def endpoint_added(self, endpoint: Endpoint) -> None:
        """Nothing to do: the list appears with the endpoint's first successful poll."""

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._models.pop(endpoint, None)

    def debug_state(self) -> dict[str, Any]:
        return {
            "key": MODELS_ATTRIBUTE_KEY,
            "endpoints": {ep.name: [m.id for m in models] for ep, models in list(self._models.items())[:100]},
        }
