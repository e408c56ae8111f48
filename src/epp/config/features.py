"""Feature gates: each concept declares the gates it owns; the config accepts only those."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

import structlog

from epp.datalayer.gates import FEATURE_GATES as DATALAYER_GATES
from epp.errors import ConfigError
from epp.flowcontrol.gates import FEATURE_GATES as FLOWCONTROL_GATES

log = structlog.get_logger(__name__)

FLOW_CONTROL: Final = "flowControl"
ENABLE_LEGACY_METRICS: Final = "enableLegacyMetrics"
DATA_LAYER: Final = "dataLayer"

# Deprecated: GIE honours it only half-way (Appendix A #15); we honour it fully.
FLOW_CONTROL_ENV: Final = "ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER"

_OWNERS: Final = (FLOWCONTROL_GATES, DATALAYER_GATES)

# Gates upstream removed: real configs still list them, so they load with a warning that names
# what replaced them (upstream refuses them as unknown; a refusal helps nobody here).
RETIRED_GATES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "prepareDataPlugins": "removed upstream (GIE 1.5, llm-d-router 0.6): data producers such as "
        "approx-prefix-cache-producer now always run when a configured plugin consumes their data; "
        "drop the gate",
    }
)

# Go's strconv.ParseBool vocabulary.
_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def registered_gates() -> Mapping[str, str]:
    """Every known gate mapped to its deprecation notice ("" for live gates)."""
    merged: dict[str, str] = {}
    for owned in _OWNERS:
        merged.update(owned)
    merged.update(RETIRED_GATES)
    return MappingProxyType(merged)


def validate_gates(gates: Sequence[str]) -> frozenset[str]:
    """The set of gates in ``featureGates``; an unknown one is a ConfigError naming its index."""
    known = registered_gates()
    for i, gate in enumerate(gates):
        if gate not in known:
            raise ConfigError(
                f"featureGates[{i}]: feature gate validation failed: "
                f"feature gate '{gate}' is unknown or unregistered"
            )
    return frozenset(gates)


def env_gates(env: Mapping[str, str]) -> frozenset[str]:
    """Gates switched on by deprecated environment variables."""
    raw = env.get(FLOW_CONTROL_ENV)
    if raw is None:
        return frozenset()
    if raw in _GO_TRUE:
        log.warning(
            "deprecated_env_var_used",
            env=FLOW_CONTROL_ENV,
            effect=f"feature gate '{FLOW_CONTROL}' enabled",
            hint=f"add '{FLOW_CONTROL}' to featureGates in the EndpointPickerConfig instead",
        )
        return frozenset({FLOW_CONTROL})
    log.warning(
        "deprecated_env_var_used",
        env=FLOW_CONTROL_ENV,
        effect="none" if raw in _GO_FALSE else f"ignored: {raw!r} is not a boolean",
        hint=f"add '{FLOW_CONTROL}' to featureGates in the EndpointPickerConfig instead",
    )
    return frozenset()


def effective_gates(config_gates: Sequence[str], env: Mapping[str, str]) -> frozenset[str]:
    """Config gates (validated) plus env-enabled ones; deprecated gates are logged once here."""
    gates = validate_gates(config_gates) | env_gates(env)
    known = registered_gates()
    for gate in sorted(gates):
        if notice := known[gate]:
            log.warning("deprecated_feature_gate_set", gate=gate, notice=notice)
    return gates
