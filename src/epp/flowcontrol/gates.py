"""Feature gates owned by flow control (collected by epp.config.features)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

# gate name -> deprecation notice ("" = a live gate).
FEATURE_GATES: Final[Mapping[str, str]] = MappingProxyType({"flowControl": ""})
