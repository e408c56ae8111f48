"""``precise-prefix-cache-producer`` (llm-d-router v0.10): the engines' reported prefix as ``PREFIX_MATCH``.

llm-d-router split its precise prefix scorer into a producer and the plain ``prefix-cache-scorer``
(which names it with ``prefixMatchInfoProducerName``).  The machinery here is the
``precise-prefix-cache-scorer``'s (tokenising, block hashing, the KV-events index, speculative
entries, trust fallbacks; docs/precise-prefix.md): this plugin runs it as a data producer and
publishes its per-endpoint match as ``PREFIX_MATCH``, which ``prefix-cache-scorer`` (and the P/D
decider, the affinity filter, ``no-hit-lru-scorer``) read as they read the approximate index's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer, PrecisePrefixParams
from epp.units import parse_go_duration


class PrecisePrefixProducerParams(PrecisePrefixParams):
    """The precise scorer's parameters plus llm-d-router's ``speculativeTTL`` (a Go duration)."""

    speculative_ttl: str = Field(default="", alias="speculativeTTL")


class PrecisePrefixCacheProducer(PrecisePrefixCacheScorer):
    """Type ``precise-prefix-cache-producer``.  Produces ``PREFIX_MATCH`` (and ``PRECISE_PREFIX_MATCH``).

    Consumes nothing: unlike the scorer it has no approximate index to fall back on (llm-d-router's
    producer has none either), so an endpoint whose event stream is not trusted matches only what
    its events still say.  ``speculativeTTL`` (e.g. ``30s``) sets ``speculativeTtlSeconds``.
    """

    TYPE: ClassVar[str] = "precise-prefix-cache-producer"
    PARAMS: ClassVar[type[PluginParams]] = PrecisePrefixProducerParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH, PRECISE_PREFIX_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()

    def __init__(self, name: str, params: PrecisePrefixProducerParams, handle: Handle) -> None:
        if params.speculative_ttl:
            try:
                ttl = parse_go_duration(params.speculative_ttl)
            except ValueError as e:
                raise ConfigError(f"speculativeTTL: {e}") from None
            if ttl <= 0:
                raise ConfigError(f"speculativeTTL: must be positive, got '{params.speculative_ttl}'")
            params = params.model_copy(update={"speculative_ttl_seconds": ttl})
        super().__init__(name, params, handle)

    def prepare(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        ids: Sequence[int] | None,
    ) -> None:
        super().prepare(state, request, endpoints, ids)
        state.set_attributes(PREFIX_MATCH, dict(state.attributes(PRECISE_PREFIX_MATCH)))
