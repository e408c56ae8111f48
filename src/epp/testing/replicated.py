"""A ``Replicated`` plugin for testing the sync hub: routed requests per endpoint, per origin.

``RoutedCounter`` (type ``test-routed-counter``) is also a ``PreRequest`` hook, so a real
EPP loading it (tests/sync/test_e2e.py registers it through an ``epp.plugins`` entry point)
has deltas to share on every request.  Its deltas are idempotent, as the contract asks:
``[endpoint, total routed by this origin]``, so a lost batch is repaired by the next one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from epp.plugin.base import Handle, NoParams, PluginBase, PluginParams

SNAPSHOT_ORIGIN = "@snapshot"


class RoutedCounter(PluginBase):
    """Counts its own routed requests per endpoint and keeps what each peer reports apart."""

    TYPE: ClassVar[str] = "test-routed-counter"
    PARAMS: ClassVar[type[PluginParams]] = NoParams

    def __init__(
        self, name: str = "test-routed-counter", params: PluginParams | None = None, handle: Any = None
    ) -> None:
        super().__init__(name, params or NoParams(), handle)
        self.own: dict[str, int] = {}
        self.learned: dict[str, dict[str, int]] = {}  # origin -> endpoint -> count
        self._changed: set[str] = set()
        self.sync_dirty: Any = None  # set by the hub: drain at the end of this tick

    @property
    def sync_key(self) -> str:
        return f"{self.TYPE}/{self.typed_name.name}"

    # --- routing -------------------------------------------------------------------------
    def count(self, endpoint: str, n: int = 1) -> None:
        self.own[endpoint] = self.own.get(endpoint, 0) + n
        self._changed.add(endpoint)
        if getattr(self, "sync_dirty", None) is not None:
            self.sync_dirty()

    def pre_request(self, state: Any, request: Any, result: Any) -> None:
        targets = result.primary.target_endpoints
        if targets:
            self.count(targets[0].metadata.name)

    def total(self, endpoint: str) -> int:
        """Own plus every peer's count: the picture a router would read."""
        return self.own.get(endpoint, 0) + sum(c.get(endpoint, 0) for c in self.learned.values())

    # --- Replicated ----------------------------------------------------------------------
    def drain(self) -> list[Any]:
        if not self._changed:
            return []
        out = [[e, self.own[e]] for e in sorted(self._changed)]
        self._changed.clear()
        return out

    def resend(self) -> None:
        """Every own count goes out whole with the next drain (the hub's resync)."""
        self._changed.update(self.own)

    def apply(self, origin: str, deltas: list[Any]) -> None:
        counts = self.learned.setdefault(origin, {})
        for endpoint, count in deltas:
            if not isinstance(endpoint, str) or not isinstance(count, int):
                raise TypeError(f"bad delta {endpoint!r}: {count!r}")
            counts[endpoint] = count

    def forget(self, origin: str) -> None:
        self.learned.pop(origin, None)

    def snapshot(self) -> Any:
        learned = {o: dict(c) for o, c in self.learned.items()}
        return {"learned": learned, "own": dict(self.own)}

    def restore(self, snapshot: Any) -> None:
        """The responder's own counts come under ``SNAPSHOT_ORIGIN`` (the contract gives no id)."""
        for origin, counts in snapshot["learned"].items():
            self.learned[origin] = dict(counts)
        self.learned[SNAPSHOT_ORIGIN] = dict(snapshot["own"])


class PolledCounter(RoutedCounter):
    """The same without ``sync_dirty``: the hub finds its changes by draining on its cadence."""

    TYPE: ClassVar[str] = "test-polled-counter"

    def __init__(
        self, name: str = "test-polled-counter", params: PluginParams | None = None, handle: Any = None
    ) -> None:
        super().__init__(name, params, handle)
        del self.sync_dirty


def make_counter(name: str = "counter", handle: Handle | None = None) -> RoutedCounter:
    return RoutedCounter(name, NoParams(), handle)
