"""Decoding vLLM's KV event batches: the msgpack payload of a [topic, seq, payload] message.

vLLM encodes ``KVEventBatch(ts, events, data_parallel_rank)`` with msgspec.  Since vllm#42892
(May 2026) the batch and each event are maps, an event's class name under ``"type"`` and fields
at their default left out; before, both were positional arrays (``[tag, field, ...]``).  Fleets
mid-upgrade mix the two, so both are read, and fields this decoder does not know are ignored.
Block hashes are ints (the digest's low 64 bits) or digest bytes; both become the 64-bit key.
Only the GPU tier (``medium`` "GPU" or absent) is indexed: a block offloaded to CPU or disk is not
a prefix-cache hit for the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from epp.datalayer.kvevents.hashing import external_hash

_DECODER: Final = msgspec.msgpack.Decoder()
GPU_MEDIA: Final = frozenset({None, "GPU"})


class WireError(ValueError):
    """The payload is not a KV event batch."""


@dataclass(slots=True)
class Stored:
    hashes: list[int]
    parent: int | None
    block_size: int
    token_ids: list[int]
    lora_name: str | None


@dataclass(slots=True)
class Removed:
    hashes: list[int]


@dataclass(slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared
CLEARED: Final = Cleared()


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event]
    data_parallel_rank: int | None
    skipped: int  # events of another medium or an unknown type


def _hashes(values: Any) -> list[int]:
    if not isinstance(values, list):
        raise WireError("block_hashes is not a list")
    return [v & 0xFFFF_FFFF_FFFF_FFFF if type(v) is int else external_hash(v) for v in values]


def _event_from_map(ev: dict[str, Any]) -> Event | None:
    kind = ev.get("type")
    if kind == "BlockStored":
        if ev.get("medium") not in GPU_MEDIA:
            return None
        parent = ev.get("parent_block_hash")
        return Stored(
            _hashes(ev.get("block_hashes")),
            None if parent is None else external_hash(parent),
            int(ev.get("block_size") or 0),
            ev.get("token_ids") or [],
            ev.get("lora_name"),
        )
    if kind == "BlockRemoved":
        if ev.get("medium") not in GPU_MEDIA:
            return None
        return Removed(_hashes(ev.get("block_hashes")))
    if kind == "AllBlocksCleared":
        return CLEARED
    return None


def _event_from_array(ev: list[Any]) -> Event | None:
    kind = ev[0] if ev else None
    if kind == "BlockStored":
        # [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]
        if (ev[6] if len(ev) > 6 else None) not in GPU_MEDIA:
            return None
        parent = ev[2]
        return Stored(
            _hashes(ev[1]),
            None if parent is None else external_hash(parent),
            int(ev[4]),
            ev[3] or [],
            ev[7] if len(ev) > 7 else None,
        )
    if kind == "BlockRemoved":
        if (ev[2] if len(ev) > 2 else None) not in GPU_MEDIA:
            return None
        return Removed(_hashes(ev[1]))
    if kind == "AllBlocksCleared":
        return CLEARED
    return None


def decode_batch(payload: bytes) -> Batch:
    """One batch, map- or array-encoded; raises WireError when it is neither."""
    try:
        raw = _DECODER.decode(payload)
    except msgspec.DecodeError as e:
        raise WireError(f"not msgpack: {e}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise WireError("not a KV event batch")
    if not isinstance(events, list):
        raise WireError("events is not a list")
    out: list[Event] = []
    skipped = 0
    try:
        for ev in events:
            if isinstance(ev, dict):
                decoded = _event_from_map(ev)
            elif isinstance(ev, list):
                decoded = _event_from_array(ev)
            else:
                decoded = None
            if decoded is None:
                skipped += 1
            else:
                out.append(decoded)
    except (IndexError, TypeError, ValueError) as e:
        raise WireError(f"malformed event: {e}") from None
    return Batch(float(ts or 0.0), out, rank if isinstance(rank, int) else None, skipped)
