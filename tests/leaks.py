"""What a C extension's calls leave behind: traced memory grown over many calls (their tests' helper)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

# One leaked small object a call over ~100k calls would be megabytes; this is the allocator's own
# bookkeeping.
TOLERANCE = 64 * 1024


def traced_growth(exercise: Callable[[int], None], *, settle: int, measured: int) -> int:
    """Bytes of traced memory grown by ``exercise(measured)``, after ``exercise(settle)`` traced
    (the tracer's own start-up).  The caller warms up first (caches, interned objects)."""
    tracemalloc.start()
    try:
        exercise(settle)
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        exercise(measured)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before
