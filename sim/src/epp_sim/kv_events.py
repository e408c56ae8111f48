"""vLLM's KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) published over ZMQ.

Wire format as vllm/distributed/kv_events.py since vllm#42892 (May 2026): msgspec msgpack of maps,
each event tagged by its class name under "type", fields left out when at their default; a
multipart message [topic, seq as 8-byte big-endian, payload] on a PUB socket, seq counting from 0.
Block hashes are the low 64 bits of vLLM's digests (epp_sim.hashing). Replay as vLLM's
ZmqEventPublisher: a ROUTER socket takes [identity, "", start seq] and answers every buffered batch
from that seq as [identity, "", seq, payload], then [identity, "", -1 (8 bytes, signed), ""].
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Final

import msgspec
import zmq

MEDIUM_GPU: Final = "GPU"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of every KV-cache event; the tag is the class name, first in the array."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[object, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
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


END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)


class KVEventPublisher:
    """One PUB socket per engine; `publish` never blocks (PUB drops at the high-water mark).

    With `replay_endpoint`, a ROUTER socket answers replay requests from the last `buffer_steps`
    batches; it is served from the event loop (add_reader), never blocking it.
    """

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        topic: str,
        dp_rank: int,
        *,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
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
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        self.silent = False  # the silent-publisher fault: batches take their seq, none is sent
        self._loop: asyncio.AbstractEventLoop | None = None
        if replay_endpoint is not None:
            self._replay = context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            bind = replay_endpoint[:-1] + "*" if replay_endpoint.endswith(":0") else replay_endpoint
            self._replay.bind(bind)
            last = self._replay.getsockopt(zmq.LAST_ENDPOINT)
            self.replay_endpoint = last.decode() if isinstance(last, bytes) else str(last)
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(int(self._replay.getsockopt(zmq.FD)), self._service_replay)

    @property
    def seq(self) -> int:
        """The sequence number the next batch gets."""
        return self._seq

    def publish(
        self, events: list[BlockStored | BlockRemoved | AllBlocksCleared], *, drop: bool = False
    ) -> None:
        """Send one batch; `drop` loses it in transit (it takes its seq and stays replayable)."""
        batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self._dp_rank)
        payload = self._encoder.encode(batch)
        seq = self._seq
        self._seq += 1
        if self._replay is not None:
            self._buffer.append((seq, payload))
        if drop or self.silent:
            return
        # zmq.Again: no peer yet on a connecting socket; the batch is lost, as it would be with vLLM
        with contextlib.suppress(zmq.Again):
            self._socket.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)

    def restart(self) -> None:
        """The engine process restarted: a new publisher counts from 0 with an empty replay buffer."""
        self._seq = 0
        self._buffer.clear()

    def _service_replay(self) -> None:
        replay = self._replay
        if replay is None:
            return
        # the FD is edge-triggered: drain every pending request
        while int(replay.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = replay.recv_multipart(flags=zmq.NOBLOCK)
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            with contextlib.suppress(zmq.Again):
                for seq, payload in self._buffer:
                    if seq >= first:
                        replay.send_multipart(
                            (client, b"", seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
                        )
                replay.send_multipart((client, b"", END_SEQ, b""), flags=zmq.NOBLOCK)

    def close(self) -> None:
        if self._replay is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(int(self._replay.getsockopt(zmq.FD)))
            self._replay.close(linger=0)
            self._replay = None
        self._socket.close(linger=0)
