"""Feature gates: owned by their concepts, validated by name, the deprecated env var honoured."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from epp.config.features import (
    DATA_LAYER,
    ENABLE_LEGACY_METRICS,
    FLOW_CONTROL,
    FLOW_CONTROL_ENV,
    RETIRED_GATES,
    effective_gates,
    env_gates,
    registered_gates,
    validate_gates,
)
from epp.errors import ConfigError


def test_registered_gates_come_from_their_owners() -> None:
    """GIE's three gates plus the retired prepareDataPlugins; dataLayer and it are deprecated."""
    gates = registered_gates()
    assert set(gates) == {FLOW_CONTROL, ENABLE_LEGACY_METRICS, DATA_LAYER, *RETIRED_GATES}
    assert sorted(g for g, notice in gates.items() if notice) == [DATA_LAYER, "prepareDataPlugins"]


def test_retired_gate_loads_with_a_warning_naming_its_replacement() -> None:
    """Upstream dropped prepareDataPlugins; real configs still list it (GIE 1.4 chart default)."""
    with capture_logs() as logs:
        gates = effective_gates(["prepareDataPlugins", FLOW_CONTROL], {})
    assert FLOW_CONTROL in gates
    (warning,) = [e for e in logs if e["event"] == "deprecated_feature_gate_set"]
    assert warning["gate"] == "prepareDataPlugins"
    assert "data producers" in warning["notice"]


def test_unknown_gate_names_its_index() -> None:
    """An unknown gate fails with GIE's message, prefixed by its position in featureGates."""
    with pytest.raises(ConfigError) as err:
        validate_gates([FLOW_CONTROL, "flowcontrol"])
    assert str(err.value) == (
        "featureGates[1]: feature gate validation failed: "
        "feature gate 'flowcontrol' is unknown or unregistered"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, frozenset(), id="unset"),
        pytest.param({FLOW_CONTROL_ENV: "true"}, frozenset({FLOW_CONTROL}), id="true"),
        pytest.param({FLOW_CONTROL_ENV: "1"}, frozenset({FLOW_CONTROL}), id="one"),
        pytest.param({FLOW_CONTROL_ENV: "TRUE"}, frozenset({FLOW_CONTROL}), id="upper"),
        pytest.param({FLOW_CONTROL_ENV: "false"}, frozenset(), id="false"),
        pytest.param({FLOW_CONTROL_ENV: "yes"}, frozenset(), id="not-a-go-bool"),
    ],
)
def test_deprecated_env_var(env: dict[str, str], expected: frozenset[str]) -> None:
    """ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER parses as Go's ParseBool and, when true, enables flowControl."""
    with capture_logs() as logs:
        assert env_gates(env) == expected
    assert [e["event"] for e in logs] == (["deprecated_env_var_used"] if env else [])


def test_effective_gates_merge_and_log_deprecations() -> None:
    """Config gates and env gates are merged; a deprecated gate is logged, not refused."""
    with capture_logs() as logs:
        gates = effective_gates([DATA_LAYER], {FLOW_CONTROL_ENV: "true"})
    assert gates == {DATA_LAYER, FLOW_CONTROL}
    assert ("deprecated_feature_gate_set", DATA_LAYER) in [(e["event"], e.get("gate")) for e in logs]
