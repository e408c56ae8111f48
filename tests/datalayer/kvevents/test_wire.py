"""KV event batches decode from vLLM's map encoding (since vllm#42892) and the older array one."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp.datalayer.kvevents.wire import Cleared, Removed, Stored, WireError, decode_batch


def structs(array_like: bool) -> tuple[Any, ...]:
    """vLLM's own definitions (vllm/distributed/kv_events.py), in either encoding."""

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False):
        ts: float
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]
        data_parallel_rank: int | None = None

    return KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared


@pytest.mark.parametrize("array_like", [False, True], ids=["map", "array"])
def test_decodes_vllm_batches(array_like: bool) -> None:
    batch_t, stored_t, removed_t, cleared_t = structs(array_like)
    digest = bytes(range(32))
    payload = msgspec.msgpack.encode(
        batch_t(
            ts=1.5,
            events=[
                stored_t([1, 2], None, list(range(32)), 16, None, "GPU", None, extra_keys=[None, None]),
                stored_t([digest], 2, list(range(16)), 16, 3, "GPU", "sql"),
                stored_t([9], None, list(range(16)), 16, None, "CPU", None),  # offloaded: not indexed
                removed_t([1], "GPU"),
                removed_t([2], "CPU"),
                cleared_t(),
            ],
            data_parallel_rank=1,
        )
    )
    batch = decode_batch(payload)
    assert (batch.ts, batch.data_parallel_rank, batch.skipped) == (1.5, 1, 2)
    low = int.from_bytes(digest[-8:], "big")
    assert [view(e) for e in batch.events] == [
        ("stored", [1, 2], None, 16, list(range(32)), None),
        ("stored", [low], 2, 16, list(range(16)), "sql"),
        ("removed", [1]),
        ("cleared",),
    ]
    first = batch.events[0]
    assert isinstance(first, Stored) and (first.has_extra, first.first_extra) == (True, None)


def view(e: Stored | Removed | Cleared) -> tuple[Any, ...]:
    if isinstance(e, Stored):
        return ("stored", e.hashes, e.parent, e.block_size, e.token_ids, e.lora_name)
    if isinstance(e, Removed):
        return ("removed", e.hashes)
    return ("cleared",)


@pytest.mark.parametrize("array_like", [False, True], ids=["map", "array"])
def test_generic_path_agrees_with_the_typed_one(array_like: bool) -> None:
    """A batch the typed decoders reject (here: an event type from the future) is read field by field,
    with the same result for the events both know."""
    batch_t, stored_t, removed_t, _ = structs(array_like)
    known = [stored_t([7, 8], 6, list(range(32)), 16, None, None, None), removed_t([7], None)]
    typed = decode_batch(msgspec.msgpack.encode(batch_t(ts=2.0, events=known)))
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch_t(ts=2.0, events=known)))
    future: Any = {"type": "BlockPinned", "block_hashes": [1]} if not array_like else ["BlockPinned", [1]]
    if array_like:
        raw[1].append(future)
    else:
        raw["events"].append(future)
    generic = decode_batch(msgspec.msgpack.encode(raw))
    assert [view(e) for e in generic.events] == [view(e) for e in typed.events]
    assert (typed.skipped, generic.skipped) == (0, 1)


def test_unknown_event_types_and_fields_are_skipped() -> None:
    payload = msgspec.msgpack.encode(
        {
            "ts": 0.0,
            "events": [{"type": "Future", "x": 1}, {"type": "BlockRemoved", "block_hashes": [4], "new": 1}],
        }
    )
    batch = decode_batch(payload)
    assert batch.events == [Removed([4])]
    assert batch.skipped == 1


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode(3), msgspec.msgpack.encode({"ts": 0, "events": 4}),
     msgspec.msgpack.encode({"ts": 0, "events": [{"type": "BlockRemoved", "block_hashes": 5}]})],
    ids=["not-msgpack", "scalar", "events-not-list", "hashes-not-list"],
)  # fmt: skip
def test_garbage_is_a_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)
