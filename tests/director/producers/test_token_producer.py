"""token-producer: llm-d's estimate backend loads; a real tokenizer backend is refused."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.errors import ConfigError

CONFIG = """
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: PARAMS
- type: decode-filter
"""


@pytest.mark.parametrize("params", [{}, {"estimate": {"image": {"mode": "static"}}}])
def test_estimate_backend_loads(params: dict[str, Any]) -> None:
    components = build(load_config(CONFIG.replace("PARAMS", repr(params))), default_registry())
    assert "token-producer" in components.plugins


@pytest.mark.parametrize(
    "params", [{"modelName": "m"}, {"vllm": {"url": "http://x"}}, {"udsTokenizerConfig": {}}]
)
def test_tokenizer_backends_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="only the estimate backend is supported"):
        build(load_config(CONFIG.replace("PARAMS", repr(params))), default_registry())
