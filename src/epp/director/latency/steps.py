"""Which engine step the prefill this EPP sent to an endpoint is in: the step running now or the next.

A vLLM-style engine (and ``epp-sim``) admits every waiting request that fits the token budget
into its next step, and all of them get their first token when that step ends.  So a request's
TTFT is not "the prefill ahead / throughput": it is the *rest of the step running now* plus the
*next step*, which carries the prefill queued behind the running one and its own.  The EPP can
follow this for its own traffic without asking the engine:

* a request sent to an endpoint with nothing of ours pending starts a step at once: it is the
  **current** step, started now;
* a request sent while something is pending waits behind it: the **queued** step;
* a first token marks the end of the step its request was in: the queued prefill becomes the
  current step, started at that moment.

``StepClock`` keeps the prefill tokens per step (an epoch number per step, a small dict) and
gives the features ``current`` tokens, ``queued`` tokens and ``elapsed`` seconds since the
current step started (0 with no current step).  Decode-only steps are invisible (they are
short); a first token that arrives out of order is charged to its own step, so the counts
never go negative and everything clears when nothing is pending.
"""

from __future__ import annotations

import math
from typing import Final

RATE_WINDOW_S: Final = 2.0  # the prefill rate's memory (exponential decay)
_MIN_BUSY_S: Final = 0.2


class StepClock:
    """One endpoint's pending prefill, split into the running step and the one queued behind it."""

    __slots__ = (
        "_busy",
        "_done",
        "_last",
        "_tokens",
        "current",
        "epoch",
        "pending",
        "queued",
        "rate",
        "started",
    )

    def __init__(self) -> None:
        self.epoch = 0  # the running step's number; the queued step is epoch + 1
        self.started = 0.0  # when the running step started (monotonic seconds)
        self.pending = 0  # requests dispatched and not past their first token
        self.current = 0.0  # prefill tokens in the running step
        self.queued = 0.0  # prefill tokens waiting for the next step
        self._tokens: dict[int, float] = {}  # per step number; older numbers are stragglers
        self._busy = 0.0  # seconds with prefill of ours pending, decayed (RATE_WINDOW_S)
        self._done = 0.0  # prefill tokens that reached their first token, decayed alike
        self._last = 0.0  # the last event
        self.rate = 0.0  # prefill tokens per busy second lately; 0 before _MIN_BUSY_S of history

    def _tick(self, now: float) -> None:
        gap = max(now - self._last, 0.0) if self._last else 0.0
        keep = math.exp(-gap / RATE_WINDOW_S)
        self._busy = self._busy * keep + (gap if self.pending else 0.0)
        self._done *= keep
        self._last = now
        self.rate = self._done / self._busy if self._busy > _MIN_BUSY_S else 0.0

    def dispatch(self, tokens: float, now: float) -> int:
        """A request with ``tokens`` uncached prompt tokens was sent; returns its step number."""
        self._tick(now)
        if self.pending == 0:
            self.started = now
            step = self.epoch
        else:
            step = self.epoch + 1
        self.pending += 1
        self._tokens[step] = self._tokens.get(step, 0.0) + tokens
        self._view()
        return step

    def first_token(self, step: int, tokens: float, now: float) -> None:
        """The request sent in step ``step`` got its first token: that step ended ``now``."""
        self._tick(now)
        self._done += tokens
        self.rate = self._done / self._busy if self._busy > _MIN_BUSY_S else 0.0
        self.cancel(step, tokens)
        if self.pending and step >= self.epoch:  # the running (or queued) step ended: the next starts
            self.epoch = step + 1
            self.started = now
            self._view()

    def cancel(self, step: int, tokens: float) -> None:
        """The request left without a first token (an error, an unstreamed body): no step ended."""
        self.pending = max(self.pending - 1, 0)
        left = self._tokens.get(step, 0.0) - tokens
        if left > 1e-6:
            self._tokens[step] = left
        else:
            self._tokens.pop(step, None)
        if self.pending == 0:
            self._tokens.clear()
            self.epoch += 1
        self._view()

    def elapsed(self, now: float) -> float:
        """Seconds since the running step started; 0 when no prefill of ours is running."""
        return now - self.started if self.current > 0 else 0.0

    def _view(self) -> None:
        self.current = self._tokens.get(self.epoch, 0.0)
        self.queued = self._tokens.get(self.epoch + 1, 0.0)
