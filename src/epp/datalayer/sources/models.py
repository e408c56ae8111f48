"""``models-data-source`` (llm-d-router): poll each endpoint's ``/v1/models``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.datalayer.served_models import ModelList, parse_models
from epp.datalayer.sources.metrics_http import HTTPSourceParams, MetricsDataSource
from epp.plugin.base import Plugin, PluginParams

SOURCE_TYPE: Final = "models-data-source"


class ModelsDataSourceParams(HTTPSourceParams):
    """Upstream's parameters: the HTTP source's, with ``path`` defaulting to ``/v1/models``."""

    path: str = "/v1/models"


class ModelsDataSource(MetricsDataSource):
    """The models an endpoint serves, from its OpenAI-compatible list.  Type ``models-data-source``.

    Fetches ``scheme://<endpoint metrics host>/path`` with the metrics source's client (one
    kept-alive connection per endpoint, the same TLS parameters) and parses the JSON list.
    Parameters as upstream: ``scheme`` (``http``), ``path`` (``/v1/models``),
    ``insecureSkipVerify`` (true), ``caCertPath``, ``clientCertPath`` + ``clientKeyPath``,
    ``interval`` (a Go duration; omitted, every tick: set one, the list rarely changes); ours:
    ``timeout``, ``maxBodyBytes``.  Output: ``ModelList``, for ``models-data-extractor``.
    """

    TYPE: ClassVar[str] = SOURCE_TYPE
    PARAMS: ClassVar[type[PluginParams]] = ModelsDataSourceParams
    OUTPUT: ClassVar[type[ModelList]] = ModelList  # type: ignore[assignment]
    # An engine without the endpoint (404) is still serving: only the metrics scrape is a
    # health signal of the model server.
    HEALTH_SIGNAL: ClassVar[bool] = False

    def bind(self, extractors: Sequence[Plugin]) -> None:
        """Nothing to narrow: the whole list is parsed."""

    async def poll(self, endpoint: Endpoint) -> ModelList:  # type: ignore[override]
        client = self._client
        if client is None:
            raise RuntimeError(f"{self.typed_name}: poll before start")
        host, port = self.target(endpoint)
        return parse_models(await client.get(host, port, self._path))
