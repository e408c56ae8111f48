"""Parameters shared by the ``kv-events-source`` data source and the ``precise-prefix-cache-scorer``
(llm-d's names where it has them), and building the subscriber from them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from epp.datalayer.kvevents.hashing import HASH_ALGOS, BlockHasher
from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.errors import ConfigError
from epp.plugin.base import PluginParams


class TokenProcessorConfig(PluginParams):
    """llm-d-kv-cache's ``tokenProcessorConfig`` plus ``hashAlgo`` (ours: the engines' algorithm).

    ``blockSizeTokens`` is the block size; the deprecated ``blockSize`` is used when it is unset,
    16 when neither is (upstream's resolution; after validation both hold the resolved size).
    ``hashAlgorithm`` (``cbor-fnv``, ``xxh64``) picks the Go index's own key chain, which need not
    match the engine's: this index keys blocks by the engine's own hashes, so it is accepted and
    has no effect.
    """

    block_size: int = 16  # deprecated upstream: blockSizeTokens
    block_size_tokens: int = 16
    hash_seed: str = ""  # the engines' PYTHONHASHSEED, verbatim
    hash_algo: str = "sha256_cbor"  # the engines' --prefix-caching-hash-algo
    hash_algorithm: Literal["", "cbor-fnv", "xxh64"] = ""

    @model_validator(mode="before")
    @classmethod
    def _resolve_block_size(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        tokens = data.pop("blockSizeTokens", data.pop("block_size_tokens", 0)) or 0
        legacy = data.pop("blockSize", data.pop("block_size", 0)) or 0
        if not isinstance(tokens, int) or not isinstance(legacy, int):
            # pydantic reports a ValueError with the field path; a TypeError would escape it
            raise ValueError("blockSizeTokens and blockSize must be integers")  # noqa: TRY004
        size = tokens or legacy or 16  # a negative size is refused where the subscriber is built
        data["blockSizeTokens"] = data["blockSize"] = size
        return data


class PodDiscoveryConfig(PluginParams):
    """llm-d's ``podDiscoveryConfig``.  The EPP subscribes to its pool's endpoints (the
    InferencePool's selector chose them), so ``podLabelSelector`` and ``podNamespace`` are
    accepted and select nothing further; ``replaySocketPort`` is the engines' replay port."""

    socket_port: int = 5557
    pod_label_selector: str = "llm-d.ai/inference-serving=true"
    pod_namespace: str = ""
    replay_socket_port: int = 0


class KVEventsConfig(PluginParams):
    """llm-d's ``kvEventsConfig`` plus our replay and silence settings.

    ``zmqEndpoint`` (centralised mode): the EPP binds it and every engine connects and publishes
    with topic ``kv@<pod-ip>@<model>`` (or ``kv@<pod-ip>:<port>@<model>``); the topic names the
    endpoint.  ``concurrency`` (upstream's worker shards) is accepted: events are applied on the
    event loop in order per endpoint.  ``engineType`` ``sglang``: decoded as vLLM's (SGLang publishes
    the same events), its block hashes are not vLLM's, so they are not verified.
    """

    zmq_endpoint: str = ""
    concurrency: int = Field(default=4, gt=0)
    engine_type: Literal["vllm", "sglang"] = "vllm"
    topic_filter: str = "kv@"
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryConfig = Field(default_factory=PodDiscoveryConfig)
    replay_port: int = 0  # the engines' replay_endpoint port; 0: no replay
    endpoints: dict[str, str] = Field(default_factory=dict)  # endpoint name or host:port → tcp://…
    replay_endpoints: dict[str, str] = Field(default_factory=dict)
    # no batch this long after the engine served a routed request that stores new blocks: inconsistent
    silence_timeout_seconds: float = Field(default=3.0, gt=0.0)
    replay_timeout_seconds: float = Field(default=2.0, gt=0.0)
    verify_hashes: bool = True  # recompute sampled root blocks to catch an algorithm/seed mismatch
    # a new verification round this often on a live stream (also on every new stream and restart)
    verify_interval_seconds: float = Field(default=30.0, gt=0.0)


def build_subscriber(
    owner: str, tp: TokenProcessorConfig, ke: KVEventsConfig, capacity: int
) -> tuple[BlockHasher, KVEventSubscriber]:
    """The engine's hasher and a subscriber feeding a new index; ConfigError names ``owner``."""
    if tp.block_size <= 0:
        raise ConfigError(
            f"{owner}: tokenProcessorConfig.blockSizeTokens (or blockSize) must be > 0, got {tp.block_size}"
        )
    if tp.hash_algo not in HASH_ALGOS:
        raise ConfigError(
            f"{owner}: tokenProcessorConfig.hashAlgo must be one of {', '.join(HASH_ALGOS)}, "
            f"got {tp.hash_algo!r}"
        )
    if capacity <= 0:
        raise ConfigError(f"{owner}: the index capacity (lruCapacityPerServer) must be > 0, got {capacity}")
    if not ke.discover_pods and not ke.endpoints and not ke.zmq_endpoint:
        raise ConfigError(
            f"{owner}: kvEventsConfig: no event source: set zmqEndpoint (the EPP binds, engines "
            "connect), discoverPods (podDiscoveryConfig.socketPort) or endpoints"
        )
    if ke.zmq_endpoint and not ke.zmq_endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(
            f"{owner}: kvEventsConfig.zmqEndpoint must be a tcp://, ipc:// or inproc:// address, "
            f"got {ke.zmq_endpoint!r}"
        )
    hasher = BlockHasher(tp.hash_algo, tp.block_size, tp.hash_seed)
    settings = SubscriberSettings(
        topic_filter=ke.topic_filter,
        socket_port=ke.pod_discovery_config.socket_port,
        replay_port=ke.replay_port or ke.pod_discovery_config.replay_socket_port,
        endpoints=dict(ke.endpoints),
        replay_endpoints=dict(ke.replay_endpoints),
        block_size=tp.block_size,
        hasher=hasher if ke.verify_hashes and ke.engine_type == "vllm" else None,
        silence_timeout=ke.silence_timeout_seconds,
        replay_timeout=ke.replay_timeout_seconds,
        verify_interval=ke.verify_interval_seconds,
        zmq_endpoint=ke.zmq_endpoint,
        per_endpoint=ke.discover_pods or bool(ke.endpoints),
    )
    return hasher, KVEventSubscriber(settings, BlockIndex(capacity))


# llm-d-kv-cache's indexerConfig parts -----------------------------------------------------------
class InMemoryIndexConfig(PluginParams):
    """``size``: keys the Go index holds over all endpoints (1e8); here it also caps each endpoint's
    LRU (``lruCapacityPerServer``) when smaller.  ``podCacheSize`` (endpoints kept per key, 10):
    accepted, no effect, a key's holders are a bitmask of every endpoint."""

    size: int = Field(default=100_000_000, gt=0)
    pod_cache_size: int = Field(default=10, gt=0)


class CostAwareMemoryIndexConfig(PluginParams):
    """The Go index's memory budget (``"2GiB"``): accepted, no effect (the LRU cap bounds memory)."""

    size: str = "2GiB"


class RedisIndexConfig(PluginParams):
    """A Redis/Valkey index shared by EPP replicas: accepted with a warning; each replica keeps its
    own in-memory index fed by the same events (what it routes on is the same)."""

    address: str = "redis://127.0.0.1:6379"
    backend_type: Literal["redis", "valkey"] = "redis"
    enable_rdma: bool = Field(default=False, alias="enableRDMA")


class KVBlockIndexConfig(PluginParams):
    in_memory_config: InMemoryIndexConfig = Field(default_factory=InMemoryIndexConfig)
    cost_aware_memory_config: CostAwareMemoryIndexConfig | None = None
    redis_config: RedisIndexConfig | None = None
    enable_metrics: bool = False  # this EPP's index metrics are always on
    metrics_logging_interval: str | int = "0s"  # Go duration (or nanoseconds): accepted, no effect
    # llm-d-kv-cache before 0.3 capped the lookup here; the scorer reads it as
    # indexerConfig.maxPrefixBlocksToMatch when that is not set
    max_prefix_blocks_to_match: int | None = Field(default=None, ge=0)


class KVCacheBackendConfig(PluginParams):
    """A KV medium's scoring weight (gpu 1.0, cpu 0.8): accepted; only GPU blocks are indexed here."""

    name: str
    weight: float


class UdsPoolConfig(PluginParams):
    socket_file: str = ""
    use_tcp: bool = Field(default=False, alias="useTCP")
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


class LocalPoolConfig(PluginParams):
    auto_discovery_dir: str = ""
    auto_discovery_tokenizer_file_name: str = ""
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


class HFPoolConfig(PluginParams):
    enabled: bool = True
    hugging_face_token: str = ""
    tokenizers_cache_dir: str = "./bin"


class TokenizersPoolConfig(PluginParams):
    """llm-d-kv-cache's (deprecated) tokenizer pool: ``uds`` when its ``socketFile`` is set, else
    a ``tokenizer.json`` for ``modelName`` from ``local`` then ``hf`` (``tokenizersCacheDir``).
    ``workersCount`` is accepted: tokenising is asynchronous here."""

    model_name: str = ""
    workers_count: int = Field(default=5, gt=0)
    hf: HFPoolConfig | None = None
    local: LocalPoolConfig | None = None
    uds: UdsPoolConfig | None = None


def default_backends() -> list[KVCacheBackendConfig]:
    return [KVCacheBackendConfig(name="gpu", weight=1.0), KVCacheBackendConfig(name="cpu", weight=0.8)]
