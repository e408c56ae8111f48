"""The sync messages on the wire: msgpack arrays, decoded against their types.

* batch (PUB → SUB): ``[sender id, seq, sent_at, {sync_key: deltas}]``; ``seq`` counts every
  message a sender publishes (heartbeats are batches with no keys), so a receiver sees the
  messages it lost as a gap; ``sent_at`` is the sender's wall clock, for the lag histogram.
* goodbye: a batch whose map holds the key ``GOODBYE`` (an empty list), sent by a replica that
  stops cleanly; peers forget its contributions at once.  A key, not a new message shape, so
  a peer that predates it counts it as an unknown key and forgets the sender on its timeout.
* resync: a batch whose map holds the key ``RESYNC`` with the ids of the peers the sender lost
  messages from; each of them marks its counts (``resend``) so its next batch carries them
  whole.  A peer that predates it counts an unknown key.
* snapshot request (DEALER → ROUTER): ``[requester id]``, or ``[requester id, secret]`` when
  the replicas share secrets (``epp.sync.secret``); reply ``[responder id, serving,
  {sync_key: snapshot}]`` (``serving`` false: the responder is itself still warming up).

A peer is not trusted to be well-formed: anything that does not decode to these types is a
``WireError`` the hub counts and drops.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

MAX_ID_LENGTH: Final = 256
GOODBYE: Final = "epp.sync/goodbye"  # no plugin's sync_key has this form (``type/name`` of a plugin)
# A batch key: ``[origin id, ...]``, the peers this replica lost messages from (a gap in their
# sequence, a silence, or never heard before); each named peer resends its counts whole.
RESYNC: Final = "epp.sync/resync"

Batch = tuple[str, int, float, dict[str, list[Any]]]
SnapshotReply = tuple[str, bool, dict[str, Any]]

_encoder: Final = msgspec.msgpack.Encoder()
_batch: Final = msgspec.msgpack.Decoder(Batch)
_request: Final = msgspec.msgpack.Decoder(tuple[str, ...])
_reply: Final = msgspec.msgpack.Decoder(SnapshotReply)


class WireError(ValueError):
    """A message that is not one of ours; ``reason`` is the metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def encode_batch(sender: str, seq: int, sent_at: float, batch: dict[str, list[Any]]) -> bytes:
    return _encoder.encode((sender, seq, sent_at, batch))


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def _decode(decoder: msgspec.msgpack.Decoder[Any], frames: list[bytes], limit: int) -> Any:
    if len(frames) != 1:
        raise WireError("frames", f"{len(frames)} frames, expected 1")
    if len(frames[0]) > limit:
        raise WireError("too_large", f"{len(frames[0])} bytes, limit {limit}")
    try:
        value = decoder.decode(frames[0])
    except msgspec.ValidationError as e:
        raise WireError("type", str(e)) from None
    except msgspec.DecodeError as e:
        raise WireError("decode", str(e)) from None
    if not value or not value[0] or len(value[0]) > MAX_ID_LENGTH:
        raise WireError("type", "sender id must be 1..256 characters")
    return value


def decode_batch(frames: list[bytes], limit: int) -> Batch:
    batch: Batch = _decode(_batch, frames, limit)
    return batch


def decode_request(frames: list[bytes], limit: int) -> tuple[str, str]:
    """The requester's id and the secret it presents ("" when none)."""
    request = _decode(_request, frames, limit)
    if len(request) > 2:
        raise WireError("type", f"a snapshot request has 1 or 2 items, got {len(request)}")
    return str(request[0]), str(request[1]) if len(request) == 2 else ""


def decode_reply(frames: list[bytes], limit: int) -> SnapshotReply:
    reply: SnapshotReply = _decode(_reply, frames, limit)
    return reply
