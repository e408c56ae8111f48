"""Parameters shared by the ``kv-events-source`` data source and the ``precise-prefix-cache-scorer``
(llm-d's names where it has them), and building the subscriber from them."""

from __future__ import annotations

from pydantic import Field

from epp.datalayer.kvevents.hashing import HASH_ALGOS, BlockHasher
from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.errors import ConfigError
from epp.plugin.base import PluginParams


class TokenProcessorConfig(PluginParams):
    """llm-d's ``tokenProcessorConfig``; ``hashAlgo`` is ours (llm-d assumes sha256_cbor)."""

    block_size: int = 16
    hash_seed: str = ""  # the engines' PYTHONHASHSEED, verbatim
    hash_algo: str = "sha256_cbor"  # the engines' --prefix-caching-hash-algo


class PodDiscoveryConfig(PluginParams):
    socket_port: int = 5557


class KVEventsConfig(PluginParams):
    """llm-d's ``kvEventsConfig`` (pod discovery mode) plus our replay and silence settings."""

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
        raise ConfigError(f"{owner}: tokenProcessorConfig.blockSize must be > 0, got {tp.block_size}")
    if tp.hash_algo not in HASH_ALGOS:
        raise ConfigError(
            f"{owner}: tokenProcessorConfig.hashAlgo must be one of {', '.join(HASH_ALGOS)}, "
            f"got {tp.hash_algo!r}"
        )
    if capacity <= 0:
        raise ConfigError(f"{owner}: the index capacity (lruCapacityPerServer) must be > 0, got {capacity}")
    if not ke.discover_pods and not ke.endpoints:
        raise ConfigError(
            f"{owner}: kvEventsConfig: only per-endpoint subscription is supported: set discoverPods "
            "(podDiscoveryConfig.socketPort) or endpoints"
        )
    hasher = BlockHasher(tp.hash_algo, tp.block_size, tp.hash_seed)
    settings = SubscriberSettings(
        topic_filter=ke.topic_filter,
        socket_port=ke.pod_discovery_config.socket_port,
        replay_port=ke.replay_port,
        endpoints=dict(ke.endpoints),
        replay_endpoints=dict(ke.replay_endpoints),
        block_size=tp.block_size,
        hasher=hasher if ke.verify_hashes else None,
        silence_timeout=ke.silence_timeout_seconds,
        replay_timeout=ke.replay_timeout_seconds,
        verify_interval=ke.verify_interval_seconds,
    )
    return hasher, KVEventSubscriber(settings, BlockIndex(capacity))
