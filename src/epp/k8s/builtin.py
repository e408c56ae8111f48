"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.k8s.peers import K8sPeerDiscovery
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (K8sPeerDiscovery,)
