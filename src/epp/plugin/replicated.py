"""The contract between a plugin's routing state and the replicas that share it.

Active-active EPP replicas (and the worker processes of one pod) each route a share of
the traffic.  What one of them learns from its own routing — in-flight load, prefix
insertions, session bindings, pending precise-prefix blocks — must reach its peers fast,
or every replica routes on a fraction of the picture.  A plugin opts in by implementing
``Replicated``; the sync hub (``epp.sync``) finds such plugins at wiring, drains their
local deltas soon after they change, sends them to every peer tagged with this replica's
identity, and applies what peers send.  The plugin never sees the transport.

Rules every implementation keeps:

* ``drain`` returns only *local* changes since the previous drain (never what ``apply``
  learned from a peer, or deltas would echo around the mesh), as msgpack-serialisable
  values (ints, floats, str, bytes, lists, dicts).  Prefer idempotent deltas ("origin O
  now holds X on endpoint E") over increments, so a lost or repeated batch cannot make
  counts drift.
* ``apply`` keeps each origin's contribution separate, so ``forget(origin)`` can remove
  exactly what a silent or departed peer contributed.  State that stays true when its
  origin dies (a prefix cached on an endpoint, a session's binding) may keep it; counts
  of work in flight must not.
* ``snapshot``/``restore`` carry the whole view (own and learned) for a warm start: a new
  replica restores a serving peer's snapshot before it reports ready.
* Every method runs on the event loop and is O(size of its argument).
* A plugin that implements the methods but is configured not to share (llm-d's
  ``syncCrossReplicaState: false``, a session strategy with nothing to share) sets an
  attribute ``replicated = False``; the hub skips it.
* Recording starts at the first ``drain`` (so a replica without peers pays one ``None``
  check per change): the hub drains every plugin once when it wires them, before traffic.
* Optionally, ``resend()``: mark all of this replica's own absolute state (counts per key) as
  changed, so the next ``drain`` carries it whole.  The hub calls it when a peer says it lost
  messages of ours (a gap in our sequence, a silence, or a first hearing), since an idempotent
  delta that was lost is otherwise repaired only when its key changes again.  Additive state
  (prefix insertions) has nothing to resend; the in-flight and prefill-load plugins do.
* Say when something changed: a plugin with an attribute ``sync_dirty`` gets the hub's
  ``dirty`` there at wiring and calls it after recording a change (cheap: one check once a
  drain is scheduled).  Every shipped plugin does, so the hub drains only when something
  changed; a plugin without it is drained on a 5 ms cadence, which costs every replica a
  wake and a drain of every plugin 200 times a second, idle or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Final, Protocol, TypeVar, runtime_checkable


@runtime_checkable
class Replicated(Protocol):
    """A plugin's share of routing state that active-active peers exchange."""

    @property
    def sync_key(self) -> str:
        """Unique per plugin instance and equal on every replica of one config (``type/name``)."""
        ...

    def drain(self) -> list[Any]:
        """Local changes since the previous call; ``[]`` when there are none."""
        ...

    def apply(self, origin: str, deltas: list[Any]) -> None:
        """Take a peer's ``drain()`` output, kept apart under ``origin`` (the peer's replica id)."""
        ...

    def forget(self, origin: str) -> None:
        """Drop what ``origin`` contributed that must not outlive it (its in-flight counts)."""
        ...

    def snapshot(self) -> Any:
        """The whole view, own and learned, for a peer's warm start."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Adopt a peer's ``snapshot()`` (called before this replica serves)."""
        ...


_HASH_LIMIT: Final = 1 << 64


def unsynced() -> None:
    """A plugin's ``sync_dirty`` until a hub binds it (nobody to tell)."""


def _uint64s(hashes: list[Any]) -> bool:
    """Whether every element is an int in [0, 2**64): C-speed passes, a few us per 256 hashes."""
    if not hashes:
        return True
    return set(map(type, hashes)) == {int} and min(hashes) >= 0 and max(hashes) < _HASH_LIMIT


_Row = TypeVar("_Row")


def parse_rows(
    batch: Any,
    what: str,
    width: int,
    valid: Callable[[Sequence[Any]], bool],
    shape: str,
    row: Callable[[Sequence[Any]], _Row],
) -> list[_Row]:
    """A peer's batch of rows (a delta or a snapshot), checked whole before any of it is used:
    a list of ``width``-long lists that ``valid`` accepts, each made into ``row``; otherwise
    ValueError naming ``what`` and the expected ``shape``, so a bad peer changes nothing."""
    if not isinstance(batch, list):
        raise ValueError(f"{what}: expected a list, got {type(batch).__name__}")  # noqa: TRY004
    out = []
    for d in batch:
        if not isinstance(d, (list, tuple)) or len(d) != width or not valid(d):
            raise ValueError(f"{what}: expected {shape}, got {d!r:.80}")
        out.append(row(d))
    return out


def parse_routed(batch: Any, what: str) -> list[tuple[str, list[int]]]:
    """Routed prefixes as peers share them (approximate index insertions, pending precise blocks):
    a peer's ``[[endpoint name, [uint64 block hash, ...]], ...]``."""
    return parse_rows(
        batch,
        what,
        2,
        lambda d: isinstance(d[0], str) and isinstance(d[1], list) and _uint64s(d[1]),
        "[endpoint name, [block hash (uint64), ...]]",
        lambda d: (d[0], d[1]),
    )


def merge_routed(batch: list[list[Any]]) -> list[list[Any]]:
    """One ``[endpoint name, hashes]`` per endpoint for a drain's insertions, in the order they were made.

    Requests that share a system prompt insert the same leading blocks on the same endpoint
    over and over; a peer inserting each chain pays a Python step per block.  Inserting one
    endpoint's chains in turn leaves its LRU ordered by each block's *last* insertion, so the
    concatenation with every block kept at its last occurrence is the same insertion in one
    call (same final order, same entries, same evictions: an LRU evicts from the front).
    Done at C speed (``dict.fromkeys`` over the reversed concatenation); ``batch`` is not changed.
    """
    if len(batch) < 2:
        return batch
    chains: dict[str, list[list[int]]] = {}
    for name, hashes in batch:
        got = chains.get(name)
        if got is None:
            chains[name] = [hashes]
        else:
            got.append(hashes)
    out: list[list[Any]] = []
    for name, lists in chains.items():
        if len(lists) == 1:
            out.append([name, lists[0]])
            continue
        flat = list(chain.from_iterable(lists))
        flat.reverse()
        out.append([name, list(reversed(dict.fromkeys(flat)))])
    return out
