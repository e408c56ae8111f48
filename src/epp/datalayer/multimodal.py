"""The multimodal encoder-cache match (llm-d-router v0.10's ``attribute/multimodal``): a shared key.

``mm-embeddings-cache-producer`` writes, per endpoint, which of the request's media items (images,
videos, audio) that endpoint is believed to have encoded recently; ``mm-embeddings-cache-scorer``
reads it.  The key lives in the data layer, below both, as the prefix match does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import AttributeKey


@dataclass(frozen=True, slots=True)
class MatchItem:
    """One unique media item of a request: its content hash, its weight (1 upstream), its modality."""

    hash: str
    size: int
    modality: str


@dataclass(frozen=True, slots=True)
class EncoderCacheMatchInfo:
    """The request's items, and those of them the endpoint likely holds in its encoder cache."""

    matched_items: tuple[MatchItem, ...]
    request_items: tuple[MatchItem, ...]

    @property
    def matched_size(self) -> int:
        return sum(i.size for i in self.matched_items)

    @property
    def request_size(self) -> int:
        return sum(i.size for i in self.request_items)


ENCODER_CACHE_MATCH: Final = AttributeKey(
    "MultiModalEncoderCacheMatchInfoKey",
    EncoderCacheMatchInfo,
    default_producer="mm-embeddings-cache-producer",
)
