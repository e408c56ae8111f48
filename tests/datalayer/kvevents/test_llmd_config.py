"""llm-d-kv-cache's configuration as the precise-prefix-cache-scorer takes it: every field of
tokenProcessorConfig, kvEventsConfig and indexerConfig accepted with upstream's defaults and
resolution rules (vectors from llm-d-router's pkg/kvcache/kvblock/token_processor_test.go and the
documented defaults), mapped where it means something here."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer, models, pre_tokenizers

from epp.datalayer.kvevents.config import KVBlockIndexConfig, KVEventsConfig, TokenProcessorConfig
from epp.datalayer.kvevents.tokenizers import UdsTokenizer
from epp.datalayer.kvevents.tokens import LocalTokenizer
from epp.errors import ConfigError
from epp.scheduling.scorers.precise_prefix import IndexerConfig, PrecisePrefixCacheScorer
from epp.testing.plugins import build


@pytest.mark.parametrize(
    ("params", "size"),
    [
        ({"blockSizeTokens": 0}, 16),  # zero is "not set": the default
        ({"blockSizeTokens": 16}, 16),
        ({"blockSize": 16}, 16),  # the deprecated name still works
        ({"blockSize": 8, "blockSizeTokens": 16}, 16),  # blockSizeTokens takes precedence
        ({}, 16),
        ({"hashSeed": "abc"}, 16),  # a partial config keeps the default size
        ({"blockSizeTokens": 8}, 8),
    ],
)
def test_block_size_resolution(params: dict[str, Any], size: int) -> None:
    tp = TokenProcessorConfig.model_validate(params)
    assert (tp.block_size, tp.block_size_tokens) == (size, size)


@pytest.mark.parametrize(
    ("params", "got"),
    [({"blockSizeTokens": -1}, -1), ({"blockSize": -5}, -5), ({"blockSizeTokens": -1, "blockSize": 8}, -1)],
)
def test_negative_block_sizes_report_the_value_set(params: dict[str, Any], got: int) -> None:
    with pytest.raises(ConfigError, match=f"must be > 0, got {got}$"):
        build(PrecisePrefixCacheScorer, tokenProcessorConfig=params)


def test_hash_algorithm_is_the_go_index_key_chain() -> None:
    for algo in ("", "cbor-fnv", "xxh64"):
        assert TokenProcessorConfig.model_validate({"hashAlgorithm": algo}).hash_algorithm == algo
    with pytest.raises(ValidationError, match="hashAlgorithm"):
        TokenProcessorConfig.model_validate({"hashAlgorithm": "sha1"})


def test_kv_events_and_index_defaults_are_upstreams() -> None:
    ke = KVEventsConfig()
    assert (ke.topic_filter, ke.concurrency, ke.discover_pods, ke.engine_type, ke.zmq_endpoint) == (
        "kv@", 4, True, "vllm", "",
    )  # fmt: skip
    pd = ke.pod_discovery_config
    assert (pd.pod_label_selector, pd.pod_namespace, pd.socket_port, pd.replay_socket_port) == (
        "llm-d.ai/inference-serving=true", "", 5557, 0,
    )  # fmt: skip
    kbi = KVBlockIndexConfig()
    assert (kbi.in_memory_config.size, kbi.in_memory_config.pod_cache_size) == (100_000_000, 10)
    assert kbi.redis_config is None and kbi.cost_aware_memory_config is None and not kbi.enable_metrics
    ic = IndexerConfig()
    assert [(b.name, b.weight) for b in ic.kv_cache_backend_configs] == [("gpu", 1.0), ("cpu", 0.8)]
    assert ic.tokenizers_pool_config is None


def test_every_llmd_field_is_accepted_and_mapped() -> None:
    """kv-cache's documented complete example, with llm-d-router's precise-prefix parameters."""
    s = build(
        PrecisePrefixCacheScorer,
        tokenProcessorConfig={"blockSizeTokens": 64, "hashSeed": "42", "hashAlgorithm": "xxh64"},
        kvEventsConfig={
            "zmqEndpoint": "tcp://*:5557",
            "topicFilter": "kv@",
            "concurrency": 8,
            "engineType": "vllm",
            "discoverPods": True,
            "podDiscoveryConfig": {
                "podLabelSelector": "app=vllm", "podNamespace": "inference", "socketPort": 5556, "replaySocketPort": 5558,
            },
        },
        indexerConfig={
            "kvBlockIndexConfig": {
                "inMemoryConfig": {"size": 1000, "podCacheSize": 10},
                "costAwareMemoryConfig": {"size": "2GiB"},
                "redisConfig": {"address": "valkey://127.0.0.1:6379", "backendType": "valkey", "enableRDMA": False},
                "enableMetrics": True,
                "metricsLoggingInterval": "1m0s",
            },
            "kvCacheBackendConfigs": [{"name": "gpu", "weight": 1.0}, {"name": "cpu", "weight": 0.8}],
        },
        speculativeIndexing=True,
        speculativeTTL="2s",
    )  # fmt: skip
    settings = s.subscriber.settings
    assert (s.block_size, settings.block_size, s.hasher.block_size) == (64, 64, 64)
    assert (settings.zmq_endpoint, settings.socket_port, settings.replay_port) == ("tcp://*:5557", 5556, 5558)
    assert s.index.capacity == 1000  # inMemoryConfig.size caps the per-endpoint LRU
    assert s.index.pending.ttl == 2.0  # speculativeTTL, a Go duration


def test_sglang_events_are_not_hash_verified() -> None:
    s = build(PrecisePrefixCacheScorer, kvEventsConfig={"engineType": "sglang"})
    assert s.subscriber.settings.hasher is None
    with pytest.raises(ValidationError, match="engineType"):
        KVEventsConfig.model_validate({"engineType": "trtllm"})


def test_older_nesting_of_the_token_processor_config() -> None:
    s = build(
        PrecisePrefixCacheScorer, indexerConfig={"tokenProcessorConfig": {"blockSize": 32, "hashSeed": "7"}}
    )
    assert (s.block_size, s.hasher.block_size) == (32, 32)
    same = {"blockSize": 32}
    assert (
        build(
            PrecisePrefixCacheScorer, tokenProcessorConfig=same, indexerConfig={"tokenProcessorConfig": same}
        ).block_size
        == 32
    )
    with pytest.raises(
        ConfigError, match=r"tokenProcessorConfig and indexerConfig\.tokenProcessorConfig differ"
    ):
        build(
            PrecisePrefixCacheScorer,
            tokenProcessorConfig={"blockSize": 16},
            indexerConfig={"tokenProcessorConfig": same},
        )


def place_tokenizer(directory: Path) -> Path:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def test_tokenizers_pool_config_selects_the_tokenizer(tmp_path: Path) -> None:
    hub = place_tokenizer(tmp_path / "hub" / "models--org--m" / "snapshots" / "r1")
    local = place_tokenizer(tmp_path / "models" / "org" / "m")
    pool: dict[str, Any] = {
        "modelName": "org/m",
        "workersCount": 8,
        "local": {"autoDiscoveryDir": str(tmp_path / "models")},
    }
    s = build(PrecisePrefixCacheScorer, indexerConfig={"tokenizersPoolConfig": pool})
    assert isinstance(s.tokens, LocalTokenizer) and s.tokens.path == str(local)
    hf = {"modelName": "org/m", "hf": {"huggingFaceToken": "x", "tokenizersCacheDir": str(tmp_path / "hub")}}
    s = build(PrecisePrefixCacheScorer, indexerConfig={"tokenizersPoolConfig": hf})
    assert isinstance(s.tokens, LocalTokenizer) and s.tokens.path == str(hub)
    uds = {"modelName": "org/m", "uds": {"socketFile": "/tmp/tokenizer/tokenizer-uds.socket"}}
    s = build(PrecisePrefixCacheScorer, indexerConfig={"tokenizersPoolConfig": uds})
    assert (
        isinstance(s.tokens, UdsTokenizer) and s.tokens.target == "unix:///tmp/tokenizer/tokenizer-uds.socket"
    )
    shutil.rmtree(tmp_path / "models")
    with pytest.raises(ConfigError, match=r"no tokenizer\.json for modelName 'org/m'"):
        build(PrecisePrefixCacheScorer, indexerConfig={"tokenizersPoolConfig": pool})
    with pytest.raises(ConfigError, match=r"tokenizersPoolConfig\.modelName must be set"):
        build(PrecisePrefixCacheScorer, indexerConfig={"tokenizersPoolConfig": {"local": {}}})


@pytest.mark.parametrize(
    ("indexer", "cap"),
    [
        ({}, 256),  # the default
        ({"maxPrefixBlocksToMatch": 64}, 64),
        ({"kvBlockIndexConfig": {"maxPrefixBlocksToMatch": 32}}, 32),  # llm-d-kv-cache before 0.3
        ({"maxPrefixBlocksToMatch": 64, "kvBlockIndexConfig": {"maxPrefixBlocksToMatch": 32}}, 64),
    ],
)
def test_the_older_kv_block_index_lookup_cap_is_read(indexer: dict[str, Any], cap: int) -> None:
    """Older configs capped the lookup in kvBlockIndexConfig; the indexer's own field wins."""
    assert build(PrecisePrefixCacheScorer, indexerConfig=indexer).max_blocks == cap
