"""``ManualClock``: a monotonic clock a test moves by hand, for plugins with a ``clock`` attribute."""

from __future__ import annotations


class ManualClock:
    """``clock()`` reads ``now``; nothing moves it but the test (``now = ...`` or ``advance``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move ``now`` on by ``seconds``; the new reading."""
        self.now += seconds
        return self.now
