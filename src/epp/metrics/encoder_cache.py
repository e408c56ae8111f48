"""llm-d-router's multimodal encoder-cache families (``mm-embeddings-cache-producer``), its names.

``llm_d_epp_encoder_cache_queries_total{plugin_type, plugin_name, modality}`` counts every media
item looked up, ``llm_d_epp_encoder_cache_hits_total{..., pod, ...}`` those an endpoint's LRU held
(per endpoint holding it), and ``llm_d_epp_encoder_cache_hit_ratio`` observes, per endpoint and
request, the share of the request's items that endpoint held.  GIE has no such families, so they
are native here, not twins (``epp.metrics.llmd``).
"""

from __future__ import annotations

from typing import Final

from epp.metrics.fast import Counter, Histogram
from epp.metrics.series import REGISTRY

ENCODER_CACHE_QUERIES: Final = Counter(
    "llm_d_epp_encoder_cache_queries",
    "[ALPHA] Total number of multimodal item hash lookups made against the encoder-cache affinity LRU.",
    ("plugin_type", "plugin_name", "modality"), registry=REGISTRY,
)  # fmt: skip
ENCODER_CACHE_HITS: Final = Counter(
    "llm_d_epp_encoder_cache_hits",
    "[ALPHA] Total number of multimodal item hash lookups that found a match in the encoder-cache "
    "affinity LRU, by endpoint.",
    ("plugin_type", "plugin_name", "pod", "modality"), registry=REGISTRY,
)  # fmt: skip
ENCODER_CACHE_HIT_RATIO: Final = Histogram(
    "llm_d_epp_encoder_cache_hit_ratio",
    "[ALPHA] Ratio of matched multimodal items to total items per endpoint in an encoder-cache lookup.",
    ("plugin_type", "plugin_name"), buckets=tuple(i / 10 for i in range(11)), registry=REGISTRY,
)  # fmt: skip
