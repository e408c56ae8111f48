"""Feature gates owned by the data layer (collected by epp.config.features)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

# gate name -> deprecation notice ("" = a live gate).
FEATURE_GATES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "enableLegacyMetrics": "",
        "dataLayer": "the pluggable data layer is always on unless enableLegacyMetrics is set; "
        "this gate does nothing and can be removed",
    }
)
