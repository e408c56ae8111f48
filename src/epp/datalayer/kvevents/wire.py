"""Decoding vLLM's KV event batches: the msgpack payload of a [topic, seq, payload] message.

vLLM encodes ``KVEventBatch(ts, events, data_parallel_rank)`` with msgspec.  Since vllm#42892
(May 2026) the batch and each event are maps, an event's class name under ``"type"`` and fields
at their default left out; before, both were positional arrays (``[tag, field, ...]``).  Fleets
mid-upgrade mix the two, so both are read, and fields this decoder does not know are ignored.
Block hashes are ints (the digest's low 64 bits) or digest bytes; both become the 64-bit key.
Only the GPU tier (``medium`` "GPU" or absent) is indexed: a block offloaded to CPU or disk is not
a prefix-cache hit for the scheduler.

Speed: typed msgspec decoders read only the fields used and leave ``token_ids`` undecoded
(``msgspec.Raw``; the hash check decodes the few it samples), three times faster than decoding to
dicts; a batch they reject (an unknown event type, a new shape) takes the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from epp.datalayer.kvevents.hashing import external_hash

_DECODER: Final = msgspec.msgpack.Decoder()
_TOKEN_IDS: Final = msgspec.msgpack.Decoder(list[int])
GPU_MEDIA: Final = frozenset({None, "GPU"})


class WireError(ValueError):
    """The payload is not a KV event batch."""


@dataclass(slots=True)
class Stored:
    hashes: list[int]
    parent: int | None
    block_size: int
    raw_token_ids: list[int] | msgspec.Raw
    lora_name: str | None
    first_extra: Any = (
        None  # the first block's extra hash keys when the engine sends them (a list), else None
    )
    has_extra: bool = False  # whether the event carried extra_keys at all

    @property
    def token_ids(self) -> list[int]:
        raw = self.raw_token_ids
        if isinstance(raw, msgspec.Raw):
            return _TOKEN_IDS.decode(raw) if raw else []
        return raw


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
        extra = ev.get("extra_keys")
        return Stored(
            _hashes(ev.get("block_hashes")),
            None if parent is None else external_hash(parent),
            int(ev.get("block_size") or 0),
            ev.get("token_ids") or [],
            ev.get("lora_name"),
            extra[0] if isinstance(extra, list) and extra else None,
            isinstance(extra, list),
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


class _MapStored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"")
    block_size: int = 0
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: msgspec.Raw = msgspec.Raw(b"")


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[int | bytes]
    medium: str | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


class _MapBatch(msgspec.Struct, gc=False):
    ts: float = 0.0
    events: list[_MapStored | _MapRemoved | _MapCleared] = []
    data_parallel_rank: int | None = None


class _ArrStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: msgspec.Raw = msgspec.Raw(b"")


class _ArrRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    block_hashes: list[int | bytes]
    medium: str | None = None


class _ArrCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _ArrBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrStored | _ArrRemoved | _ArrCleared]
    data_parallel_rank: int | None = None


_TYPED: Final = (msgspec.msgpack.Decoder(_MapBatch), msgspec.msgpack.Decoder(_ArrBatch))


def _typed_hashes(values: list[int | bytes]) -> list[int]:
    if values and type(values[0]) is int and type(values[-1]) is int:
        return values  # type: ignore[return-value]  # uint64 ints: already the key
    return [external_hash(v) for v in values]


def _typed(raw: _MapBatch | _ArrBatch) -> Batch:
    out: list[Event] = []
    skipped = 0
    for ev in raw.events:
        if isinstance(ev, (_MapCleared, _ArrCleared)):
            out.append(CLEARED)
        elif ev.medium not in GPU_MEDIA:
            skipped += 1
        elif isinstance(ev, (_MapStored, _ArrStored)):
            parent = ev.parent_block_hash
            stored = Stored(
                _typed_hashes(ev.block_hashes),
                None if parent is None else external_hash(parent),
                ev.block_size,
                ev.token_ids,
                ev.lora_name,
            )
            if parent is None and ev.extra_keys:  # only root blocks are ever verified
                extra = _DECODER.decode(ev.extra_keys)
                if isinstance(extra, list):
                    stored.has_extra = True
                    stored.first_extra = extra[0] if extra else None
            out.append(stored)
        else:
            out.append(Removed(_typed_hashes(ev.block_hashes)))
    return Batch(raw.ts, out, raw.data_parallel_rank, skipped)


def decode_batch(payload: bytes) -> Batch:
    """One batch, map- or array-encoded; raises WireError when it is neither."""
    for decoder in _TYPED:
        try:
            return _typed(decoder.decode(payload))
        except msgspec.MsgspecError:
            continue
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
