"""vLLM's KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) published over ZMQ.

Wire format as vllm/distributed/kv_events.py: msgspec msgpack of array-like tagged structs, a
multipart message [topic, seq as 8-byte big-endian, payload] on a PUB socket, seq counting from 0.
"""

from __future__ import annotations

import contextlib
import time
from typing import Final

import msgspec
import zmq

MEDIUM_GPU: Final = "GPU"


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of every KV-cache event; the tag is the class name, first in the array."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind for wildcard hosts, ipc:// and inproc://; here also for port 0; else connect."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith(("ipc://", "inproc://"))
        or endpoint.endswith(":0")
    )


def offset_endpoint(endpoint: str, offset: int) -> str:
    """Shift a bound tcp endpoint's port by `offset` (vLLM adds the DP rank); port 0 stays 0."""
    if offset == 0 or not endpoint.startswith("tcp://") or not is_bind_endpoint(endpoint):
        return endpoint
    host, _, port = endpoint.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return endpoint
    return f"{host}:{int(port) + offset}"


class KVEventPublisher:
    """One PUB socket per engine; `publish` never blocks (PUB drops at the high-water mark)."""

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str, topic: str, dp_rank: int
    ) -> None:
        self._socket = context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.setsockopt(zmq.LINGER, 0)
        if is_bind_endpoint(endpoint):
            self._socket.bind(endpoint[:-1] + "*" if endpoint.endswith(":0") else endpoint)
            last = self._socket.getsockopt(zmq.LAST_ENDPOINT)
            self.endpoint = last.decode() if isinstance(last, bytes) else str(last)
        else:
            self._socket.connect(endpoint)
            self.endpoint = endpoint
        self.topic = topic
        self._topic = topic.encode()
        self._dp_rank = dp_rank
        self._seq = 0
        self._encoder = msgspec.msgpack.Encoder()

    def publish(self, events: list[BlockStored | BlockRemoved | AllBlocksCleared]) -> None:
        batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self._dp_rank)
        frames = (self._topic, self._seq.to_bytes(8, "big"), self._encoder.encode(batch))
        self._seq += 1
        # zmq.Again: no peer yet on a connecting socket; the batch is lost, as it would be with vLLM
        with contextlib.suppress(zmq.Again):
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)

    def close(self) -> None:
        self._socket.close(linger=0)
