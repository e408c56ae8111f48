"""The production plugin registry: every concept's built-in plugins plus installed out-of-tree ones."""

from __future__ import annotations

from itertools import chain

from epp.datalayer.builtin import BUILTINS as DATALAYER_BUILTINS
from epp.director.builtin import BUILTINS as DIRECTOR_BUILTINS
from epp.flowcontrol.builtin import BUILTINS as FLOWCONTROL_BUILTINS
from epp.k8s.builtin import BUILTINS as K8S_BUILTINS
from epp.parsers.builtin import BUILTINS as PARSERS_BUILTINS
from epp.plugin.registry import ENTRY_POINT_GROUP, Registry
from epp.scheduling.builtin import BUILTINS as SCHEDULING_BUILTINS
from epp.sync.builtin import BUILTINS as SYNC_BUILTINS


def default_registry(*, entry_points: bool = True) -> Registry:
    """A fresh registry (never a global); a type registered twice is a ConfigError."""
    registry = Registry(
        chain(
            SCHEDULING_BUILTINS,
            DIRECTOR_BUILTINS,
            PARSERS_BUILTINS,
            DATALAYER_BUILTINS,
            FLOWCONTROL_BUILTINS,
            SYNC_BUILTINS,
            K8S_BUILTINS,
        )
    )
    if entry_points:
        registry.load_entry_points(ENTRY_POINT_GROUP)
    return registry
