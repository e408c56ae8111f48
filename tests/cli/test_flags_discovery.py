"""A config's dataLayer.discovery (file-discovery) is a way to find endpoints: no discovery flag is
needed, and a discovery flag beside it is refused (two sources would fight over the datastore)."""

from __future__ import annotations

import pytest

from epp.cli.flags import parse_flags
from epp.errors import ConfigError

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {path: /etc/epp/endpoints.yaml}
dataLayer:
  discovery: {pluginRef: file-discovery}
"""


def test_config_discovery_needs_no_flag() -> None:
    opts = parse_flags(["--config-text", CONFIG], {})
    assert not (opts.pool_name or opts.endpoint_selector or opts.endpoints or opts.endpoints_file)


def test_config_discovery_and_a_flag_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"flag \"endpoints\" and the config's dataLayer\.discovery"):
        parse_flags(["--config-text", CONFIG, "--endpoints", "127.0.0.1:8000"], {})


def test_without_discovery_a_flag_is_still_required() -> None:
    with pytest.raises(ConfigError, match="either pool-name or endpoint-selector must be set"):
        parse_flags(["--config-text", CONFIG.split("dataLayer:")[0]], {})
