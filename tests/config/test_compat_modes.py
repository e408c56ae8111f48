"""llm-d <= v0.2's ``prefix-cache-scorer`` ``mode`` form loads as the plugin each mode became."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from structlog.testing import capture_logs

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config, load_config_file
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.errors import ConfigError
from epp.scheduling.scorers.precise_prefix import PrecisePrefixCacheScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from tests.config.test_real_configs import ADDRESSES, CORPUS, _director
from tests.datalayer.kvevents.test_llmd_config import place_tokenizer

V05 = CORPUS / "llmd-router-v0.5.0--sim-epp-kvcache-config.yaml"


def _config(mode: str, extra: str = "") -> str:
    return f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    mode: {mode}{extra}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""


async def test_llmd_v05_sample_loads_and_routes_as_the_precise_scorer(tmp_path: Path) -> None:
    """The corpus file, its tokenizer cache directory pointed at one that holds the model's tokenizer."""
    place_tokenizer(tmp_path / "<model-name>")
    text = V05.read_text().replace('"/cache/tokenizers"', f'"{tmp_path}"')
    config = tmp_path / "config.yaml"
    config.write_text(text)
    with capture_logs() as logs:
        components = build(load_config_file(config), default_registry())
    scorer = components.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    events = {(e["event"], e.get("path")) for e in logs}
    assert ("deprecated_plugin_form", "plugins[0].parameters.mode") in events
    assert (
        "deprecated_plugin_parameters_ignored",
        "plugins[0].parameters.indexerConfig.prefixStoreConfig",
    ) in events
    (form,) = [e for e in logs if e["event"] == "deprecated_plugin_form"]
    assert "precise-prefix-cache-scorer" in form["replacement"]
    d = _director(components)
    body = orjson.dumps({"model": "m", "prompt": "hi hi hi " * 40, "max_tokens": 5})
    try:
        decision = await d.start({}, {}).route(body)
    finally:
        for plugin in components.lifecycle:
            await plugin.stop()
    assert decision.destination.split(",")[0].rpartition(":")[0] in ADDRESSES


def test_cache_tracking_parameters_reach_the_precise_scorer(tmp_path: Path) -> None:
    """tokenProcessorConfig and kvEventsConfig keep their meaning on the replacement."""
    place_tokenizer(tmp_path / "org" / "m")
    extra = f"""
    tokenProcessorConfig:
      blockSize: 32
      hashSeed: "42"
    kvEventsConfig:
      zmqEndpoint: tcp://127.0.0.1:0
    indexerConfig:
      prefixStoreConfig:
        cacheSize: 100
      tokenizersPoolConfig:
        modelName: org/m
        local:
          autoDiscoveryDir: {tmp_path}"""
    components = build(load_config(_config("cache_tracking", extra)), default_registry())
    scorer = components.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    assert scorer.typed_name.type == "precise-prefix-cache-scorer"
    assert scorer.block_size == 32
    assert scorer.hasher.none_hash == BlockHasher(scorer.hasher.algo, 32, "42").none_hash


def test_estimate_mode_is_the_approximate_scorer() -> None:
    with capture_logs() as logs:
        components = build(load_config(_config("estimate")), default_registry())
    assert isinstance(components.plugins["prefix-cache-scorer"], PrefixCacheScorer)
    assert [e["path"] for e in logs if e["event"] == "deprecated_plugin_parameters_ignored"] == [
        "plugins[0].parameters.mode"
    ]


def test_unknown_mode_names_the_field_and_the_replacements() -> None:
    with pytest.raises(
        ConfigError, match=r"plugins\[0\]\.parameters\.mode: unknown mode 'exact'.*precise-prefix"
    ):
        build(load_config(_config("exact")), default_registry())
