"""``OriginShares``: what each peer last reported per key, for the ``Replicated`` plugins that count.

Plugins that share a count of work in flight (``inflight-load-producer``'s requests and tokens,
``prefill-load-scorer``'s backlog) send their own *absolute* value per changed key, so a lost
or repeated batch cannot make the sum drift (``epp.plugin.replicated``).  The receiving side is
the same for every such plugin: keep each origin's last value per key apart, so ``forget`` can
take exactly that origin's share back out; a warm start's snapshot brings the source replica's
own values under a placeholder origin (``SNAPSHOT_ORIGIN``: the snapshot names no id for them)
that yields, key by key, to the first delta naming the key, and that any ``forget`` drops (it is
as stale as the peer being forgotten).  This table is that bookkeeping, written once; the plugin
keeps its read-side totals and learns every change through ``changed(key, new, old)``, called
with the value an origin now holds on ``key`` and the one it replaces (``zero`` for none), after
the table has stored the new one.

Values are compared with ``zero`` to decide what to keep, so a value type must compare equal to
its zero when it means "nothing" (an int, a tuple of ints).  Every operation is O(its
argument): an ``apply`` touches only the keys its rows name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final, Generic, TypeVar

SNAPSHOT_ORIGIN: Final = "\x00snapshot"  # restore(): the source's own values, by key, until a delta names it

V = TypeVar("V")


class OriginShares(Generic[V]):
    """Each origin's last reported value per key; ``changed`` keeps the owner's totals in step."""

    __slots__ = ("_by_origin", "_changed", "_zero")

    def __init__(self, zero: V, changed: Callable[[str, V, V], None]) -> None:
        self._zero = zero
        self._changed = changed
        self._by_origin: dict[str, dict[str, V]] = {}

    def apply(self, origin: str, rows: Iterable[tuple[str, V]]) -> None:
        """``origin`` now holds these values on these keys (rows already checked by the caller).

        A key the restored snapshot still held for its source yields to the delta: the placeholder's
        value is reported gone first (the delta's origin is the source, or a replica that knows better).
        """
        zero, changed = self._zero, self._changed
        by_origin = self._by_origin
        mine = by_origin.setdefault(origin, {})
        restored = by_origin.get(SNAPSHOT_ORIGIN) if origin != SNAPSHOT_ORIGIN else None
        for key, value in rows:
            old = mine.pop(key, zero)
            if value != zero:
                mine[key] = value
            if restored is not None:
                stale = restored.pop(key, zero)
                if stale != zero:
                    changed(key, zero, stale)
            if value != old:
                changed(key, value, old)
        for o in (origin, SNAPSHOT_ORIGIN):
            if not by_origin.get(o, True):
                del by_origin[o]

    def forget(self, origin: str) -> None:
        """Take ``origin``'s values out, and the restored snapshot's (it is as stale)."""
        self.drop(origin)
        self.drop(SNAPSHOT_ORIGIN)

    def drop(self, origin: str) -> None:
        """Take ``origin``'s values out (reported as ``changed(key, zero, value)``)."""
        zero, changed = self._zero, self._changed
        for key, value in self._by_origin.pop(origin, {}).items():
            changed(key, zero, value)

    def restore(self, batches: Iterable[tuple[str, Iterable[tuple[str, V]]]]) -> None:
        """Each origin's values replaced by the batch's (a snapshot: peers by id, the source's own
        under ``SNAPSHOT_ORIGIN``); the caller has checked every batch before calling."""
        for origin, rows in batches:
            self.drop(origin)
            self.apply(origin, rows)

    def discard_key(self, key: str) -> None:
        """Every origin's value on ``key`` goes without a report (the owner dropped the key's total)."""
        for values in self._by_origin.values():
            values.pop(key, None)

    def values_of(self, key: str) -> Iterator[V]:
        """Every origin's value on ``key`` (for a total built afresh)."""
        for values in self._by_origin.values():
            value = values.get(key)
            if value is not None:
                yield value

    def peers(self) -> dict[str, dict[str, V]]:
        """Every origin's values but the placeholder's (a snapshot's ``peers``): copies."""
        return {o: dict(m) for o, m in self._by_origin.items() if o != SNAPSHOT_ORIGIN}

    def debug(self) -> dict[str, dict[str, V]]:
        """Every origin's values, the placeholder's included: copies."""
        return {o: dict(m) for o, m in self._by_origin.items()}

    def __contains__(self, origin: object) -> bool:
        return origin in self._by_origin
