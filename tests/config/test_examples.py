"""Every shipped config file loads and builds with the production registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config_file

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
FILES = sorted([*CONFIG_DIR.glob("*.yaml"), *CONFIG_DIR.glob("examples/*.yaml")])


def test_examples_are_present() -> None:
    """The built-in default, GIE's five example configs (§8.3 a-e), the chart's predictor-enabled variant
    (§8.3 b) and our mixed-SLO variant of it, our prefix-and-load, endpoint-health, llm-d-router and precise-prefix (alone and with sessions) ones, and llm-d's two P/D configs are shipped."""
    assert [str(p.relative_to(CONFIG_DIR)) for p in FILES] == [
        "default.yaml",
        "examples/conformance.yaml",
        "examples/endpoint-health.yaml",
        "examples/flow-control.yaml",
        "examples/helm-default.yaml",
        "examples/integration-default.yaml",
        "examples/llm-d-router.yaml",
        "examples/pd-disaggregation.yaml",
        "examples/precise-prefix-sessions.yaml",
        "examples/precise-prefix.yaml",
        "examples/predicted-latency-mixed-slo.yaml",
        "examples/predicted-latency.yaml",
        "examples/prefix-and-load.yaml",
        "examples/request-attribute-reporter.yaml",
        "examples/sim-pd-epp-config.yaml",
    ]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_config_file_loads_and_builds(path: Path) -> None:
    """The file is a complete EndpointPickerConfig that the real plugins accept."""
    components = build(load_config_file(path), default_registry())
    assert components.scheduler.profiles
    assert components.parser is not None
