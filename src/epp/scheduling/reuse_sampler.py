"""How well a prefix scorer's prediction of cache reuse held: predicted vs observed cached tokens.

A measurement tool, not a routing input: ``precise-prefix-cache-scorer`` predicts, per routed
request, how many prompt tokens the picked engine will find cached, and at ResponseComplete
hands this sampler the prediction beside the engine's ``cached_tokens``.  The sampler keeps
running correlations of the two and the last ``SAMPLES`` requests' rows (``SAMPLE_FIELDS``) for
``/debug/plugins/state``; nothing reads it back to route.  It lives beside the scorers (as
``normalize.py`` and ``picking.py`` do) so the scorer module holds only the scorer.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Final

SAMPLE_FIELDS: Final = (
    "predicted",
    "predictedRouted",
    "predictedConfirmed",
    "observed",
    "promptTokens",
    "queuedNewBlocksAtPick",
    "firstByteMs",
    "waitingAtPick",
    "kvUseAtPick",
    "holdersComputedAtPick",
    "holdersUncomputedAtPick",
    "latestHolderDecodingMsAtPick",
)
SAMPLES: Final = 2048  # the last routed requests' predictions kept for /debug/plugins/state


class Correlation:
    """Running Pearson correlation and mean absolute error of (predicted, observed)."""

    __slots__ = ("abs_err", "n", "sx", "sxx", "sxy", "sy", "syy")

    def __init__(self) -> None:
        self.n = 0
        self.sx = self.sy = self.sxx = self.syy = self.sxy = self.abs_err = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.syy += y * y
        self.sxy += x * y
        self.abs_err += abs(x - y)

    def state(self) -> dict[str, Any]:
        n = self.n
        r: float | None = None
        if n > 1:
            vx = n * self.sxx - self.sx * self.sx
            vy = n * self.syy - self.sy * self.sy
            if vx > 0 and vy > 0:
                r = (n * self.sxy - self.sx * self.sy) / math.sqrt(vx * vy)
        return {
            "samples": n,
            "pearson": r,
            "meanPredictedTokens": self.sx / n if n else None,
            "meanObservedTokens": self.sy / n if n else None,
            "meanAbsErrorTokens": self.abs_err / n if n else None,
        }


class ReuseSampler:
    """Three predictions against what the engine reported, and the recent rows they came from.

    ``predicted`` is what the pick will still hold when the request runs (eviction-aware),
    ``predictedRouted`` what the scorer used (pending blocks included), ``predictedConfirmed``
    the same from reported blocks only: where the three part says which estimate is off.
    """

    __slots__ = ("confirmed", "predicted", "routed", "rows", "unreported")

    def __init__(self, size: int = SAMPLES) -> None:
        self.predicted = Correlation()
        self.routed = Correlation()
        self.confirmed = Correlation()
        self.rows: deque[tuple[float, ...]] = deque(maxlen=size)  # SAMPLE_FIELDS each
        self.unreported = 0  # responses without cached_tokens: nothing to compare

    def add(self, row: tuple[float, ...]) -> None:
        """One request's row, in ``SAMPLE_FIELDS`` order (its first four: the three predictions
        and the observed cached tokens)."""
        observed = row[3]
        self.predicted.add(row[0], observed)
        self.routed.add(row[1], observed)
        self.confirmed.add(row[2], observed)
        self.rows.append(row)

    def missing(self) -> None:
        """A response that did not report its cached tokens."""
        self.unreported += 1

    def state(self) -> dict[str, Any]:
        return {
            "predictedVsObserved": {
                **self.predicted.state(),
                "responsesWithoutCachedTokens": self.unreported,
            },
            # what the pick held at routing (pending included), without the eviction estimate
            "asRoutedVsObserved": self.routed.state(),
            # the same with the prediction from reported blocks only (no pending entries)
            "confirmedOnlyVsObserved": self.confirmed.state(),
            "recentPredictions": {"fields": list(SAMPLE_FIELDS), "rows": [list(r) for r in self.rows]},
        }
